// ThreadPool: workers wait on a generation counter; each job is split into n_threads chunks
// and chunk i runs on worker i-1 (chunk 0 on the caller), so there is no queue to contend on.
#include "kiln/base/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace kiln {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
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
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunks = job_chunks_;
    }
    if (index < chunks) {
      int64_t b, e;
      chunk_range(n, chunks, index, b, e);
      if (b < e) (*job)(b, e);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) cv_done_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  int chunks = static_cast<int>(std::min<int64_t>(n_threads(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk))));
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_start_.notify_all();
  int64_t b, e;
  chunk_range(n, chunks, 0, b, e);
  fn(b, e);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return pending_ == 0; });
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    const char* e = std::getenv("KILN_THREADS");
    return e ? std::atoi(e) : 0;
  }());
  return pool;
}

}  // namespace kiln
