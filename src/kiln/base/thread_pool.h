// A fixed pool of worker threads for data-parallel loops: parallel_for splits [0, n) into
// contiguous chunks, runs them on the workers and the caller, and returns when all are done.
// Workers and the caller spin briefly (kSpinMicros) before sleeping on a condition variable, so the
// ~100 loops of a decode step do not each pay two futex wakeups; an idle pool sleeps.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // n_threads counts the calling thread; 0 means the number of hardware threads.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(begin, end) over chunks of [0, n); each chunk holds at least min_chunk items
  // (so tiny loops stay on one thread). Calls from several threads run one after another. Not
  // reentrant: do not call from inside fn.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

  // The process-wide pool (sized by KILN_THREADS or the hardware).
  static ThreadPool& global();

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  // The job: written by parallel_for before it bumps generation_ (release), read by the workers
  // after they see the new generation (acquire).
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};   // workers still running the current job
  std::atomic<int> sleepers_{0};  // workers asleep on cv_start_ (parallel_for notifies only then)
  std::atomic<bool> stop_{false};
};

}  // namespace kiln
