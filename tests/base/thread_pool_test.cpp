// ThreadPool: every index of [0, n) runs exactly once in contiguous chunks, on several threads,
// for back-to-back calls (the workers' spinning path), for calls spaced past the spin window (the
// sleep/wake path: a lost wakeup would hang here), with more threads than cores, with callers on
// two threads, and the pool shuts down whether its workers spin or sleep.
#include "kiln/base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace kiln {
namespace {

// Runs one parallel_for over [0, n) and checks each index was visited once, by contiguous chunks.
void expect_cover(ThreadPool& pool, int64_t n, int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> bad_chunks{0};
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        if (b >= e || e - b < std::min<int64_t>(min_chunk, n)) bad_chunks.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      },
      min_chunk);
  EXPECT_EQ(bad_chunks.load(), 0) << "n=" << n << " min_chunk=" << min_chunk;
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n;
}

TEST(ThreadPool, CoversEveryIndexOnceForEverySize) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.n_threads(), threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097})
      for (int64_t min_chunk : {1, 16, 5000}) expect_cover(pool, n, min_chunk);
  }
}

TEST(ThreadPool, BackToBackCallsKeepTheirResults) {
  ThreadPool pool(3);  // more threads than this machine's cores in CI: the yielding spin path
  std::vector<int64_t> out(2048);
  for (int it = 0; it < 20000; ++it) {
    const int64_t n = 1 + (it * 37) % 2048;
    std::atomic<int64_t> sum{0};
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      int64_t s = 0;
      for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = i * it, s += i;
      sum.fetch_add(s);
    });
    ASSERT_EQ(sum.load(), n * (n - 1) / 2) << "call " << it;
    ASSERT_EQ(out[static_cast<size_t>(n - 1)], (n - 1) * it) << "call " << it;
  }
}

TEST(ThreadPool, CallsAfterTheWorkersSleptStillRun) {
  ThreadPool pool(2);
  for (int it = 0; it < 20; ++it) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the 200 µs spin window
    expect_cover(pool, 100, 1);
  }
}

TEST(ThreadPool, WorkRunsOnSeveralThreads) {
  ThreadPool pool(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.parallel_for(1000, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // each chunk outlives a chunk handoff
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 2u);
}

TEST(ThreadPool, CallersOnSeveralThreadsTakeTurns) {
  ThreadPool pool(2);
  auto caller = [&] {
    for (int it = 0; it < 2000; ++it) expect_cover(pool, 1 + it % 300, 1);
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
}

TEST(ThreadPool, ShutsDownWhetherWorkersSpinOrSleep) {
  { ThreadPool spinning(3); expect_cover(spinning, 10, 1); }  // destroyed right after a call
  {
    ThreadPool sleeping(3);
    expect_cover(sleeping, 10, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  { ThreadPool idle(4); }  // never used
  SUCCEED();
}

}  // namespace
}  // namespace kiln
