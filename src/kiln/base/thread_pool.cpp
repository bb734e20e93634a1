// ThreadPool: workers wait on a generation counter; each job is split into n_threads chunks
// and chunk i runs on worker i-1 (chunk 0 on the caller), so there is no queue to contend on.
// Waiting spins for up to kSpinMicros, then sleeps. A worker going to sleep counts itself in
// sleepers_ before it re-checks the generation under the lock, and parallel_for reads sleepers_
// after bumping the generation (both sequentially consistent), so either the worker sees the new
// job or parallel_for sees the sleeper and notifies it under the lock: no wakeup is lost.
#include "kiln/base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace kiln {

namespace {

constexpr int64_t kSpinMicros = 200;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() or kSpinMicros pass; true when done() held. After the first few hundred
// polls it yields the core between polls, so a pool with more threads than free cores (parallel
// test runs, a busy machine) does not starve the thread that holds the work.
template <typename F>
bool spin_until(F&& done) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (done()) return true;
    if (i < 512) {
      cpu_relax();
    } else {
      std::this_thread::yield();
      if (i % 16 == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(kSpinMicros)) return done();
    }
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

static void chunk_range(int64_t n, int chunks, int i, int64_t& b, int64_t& e) {
  b = n * i / chunks;
  e = n * (i + 1) / chunks;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] { return stop_.load() || generation_.load() != seen; };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      cv_start_.wait(lock, ready);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = generation_.load();
    const std::function<void(int64_t, int64_t)>* job = job_;
    const int64_t n = job_n_;
    const int chunks = job_chunks_;
    if (index < chunks) {
      int64_t b, e;
      chunk_range(n, chunks, index, b, e);
      if (b < e) (*job)(b, e);
    }
    if (pending_.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // parallel_for may be between its check and its wait
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  int chunks = static_cast<int>(std::min<int64_t>(n_threads(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk))));
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  pending_.store(static_cast<int>(workers_.size()));
  generation_.fetch_add(1);  // publishes the job (sequentially consistent: see the file comment)
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_start_.notify_all();
  }
  int64_t b, e;
  chunk_range(n, chunks, 0, b, e);
  fn(b, e);
  auto done = [&] { return pending_.load() == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, done);
  }
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    const char* e = std::getenv("KILN_THREADS");
    return e ? std::atoi(e) : 0;
  }());
  return pool;
}

}  // namespace kiln
