// The engine thread of a server: one thread owns the Engine (model, KV cache, sequences) and
// runs its steps; other threads submit requests through a queue and read each request's events
// from a Channel. Cancellation (client gone, stop string, timeout) goes through the same queue.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/engine/engine.h"

namespace kiln::engine {

// Events of one HTTP request's engine requests (its n choices), tagged by choice index.
class Channel {
 public:
  struct Item {
    int choice = 0;
    TokenEvent event;
    std::chrono::steady_clock::time_point time;  // when the engine reported it
  };
  void push(int choice, TokenEvent e);
  // Waits up to `timeout` for items; returns what is there (possibly nothing).
  std::vector<Item> pop(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
};

// Counters and gauges for /metrics, refreshed by the engine thread after every step.
struct EngineSnapshot {
  int queued = 0;          // submitted, not yet admitted (queue + scheduler's waiting)
  int running = 0;         // sequences in the running batch
  int blocks_used = 0, blocks_cached = 0, blocks_free = 0, blocks_total = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, cache_hit_tokens = 0, preemptions = 0, steps = 0;
  double busy_seconds = 0;  // time spent in steps
  double decode_seconds = 0, prefill_seconds = 0;
  int64_t draft_tokens = 0, accepted_tokens = 0, verifies = 0;  // speculative decoding (EngineStats)
  bool ssd_on = false;
  kvstore::SsdStats ssd;  // the SSD tier's counters, when on
};

class EngineThread {
 public:
  explicit EngineThread(Engine& engine);
  ~EngineThread();  // stops the thread; open requests end with an error event
  EngineThread(const EngineThread&) = delete;
  EngineThread& operator=(const EngineThread&) = delete;

  // Queues a request; its events arrive on `ch` tagged with `choice`. A request the engine
  // refuses ends at once with an `error` event.
  void submit(Request r, std::shared_ptr<Channel> ch, int choice);
  // Cancels the request of `choice` on `ch`, or all of them for -1 (frees their KV blocks at the
  // next turn of the loop).
  void cancel(const std::shared_ptr<Channel>& ch, int choice = -1);
  EngineSnapshot snapshot() const;
  int queue_depth() const;

 private:
  struct Pending {
    Request request;
    std::shared_ptr<Channel> ch;
    int choice;
  };
  struct Live {
    int64_t id;
    std::shared_ptr<Channel> ch;
    int choice;
  };
  void loop();
  void refresh_snapshot();

  Engine& engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<std::pair<std::shared_ptr<Channel>, int>> cancels_;
  bool stop_ = false;
  EngineSnapshot snap_;
  std::vector<Live> live_;  // engine thread only
  double busy_seconds_ = 0;
  std::thread thread_;
};

}  // namespace kiln::engine
