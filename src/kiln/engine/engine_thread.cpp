// EngineThread: the loop takes new requests and cancellations from the queue, runs one engine
// step, publishes a snapshot, and sleeps when there is nothing to do.
#include "kiln/engine/engine_thread.h"

#include <algorithm>

#include "kiln/base/log.h"

namespace kiln::engine {

void Channel::push(int choice, TokenEvent e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    items_.push_back({choice, std::move(e), std::chrono::steady_clock::now()});
  }
  cv_.notify_one();
}

std::vector<Channel::Item> Channel::pop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !items_.empty(); });
  std::vector<Item> out(std::make_move_iterator(items_.begin()), std::make_move_iterator(items_.end()));
  items_.clear();
  return out;
}

EngineThread::EngineThread(Engine& engine) : engine_(engine) {
  refresh_snapshot();
  thread_ = std::thread([this] { loop(); });
}

EngineThread::~EngineThread() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineThread::submit(Request r, std::shared_ptr<Channel> ch, int choice) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.push_back({std::move(r), std::move(ch), choice});
  }
  cv_.notify_all();
}

void EngineThread::cancel(const std::shared_ptr<Channel>& ch, int choice) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancels_.emplace_back(ch, choice);
  }
  cv_.notify_all();
}

EngineSnapshot EngineThread::snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineSnapshot s = snap_;
  s.queued += static_cast<int>(pending_.size());
  return s;
}

int EngineThread::queue_depth() const { return snapshot().queued; }

void EngineThread::refresh_snapshot() {
  const auto& st = engine_.stats();
  const auto& bm = engine_.blocks();
  std::lock_guard<std::mutex> lk(mu_);
  snap_.queued = static_cast<int>(engine_.scheduler().waiting().size());
  snap_.running = static_cast<int>(engine_.scheduler().running().size());
  snap_.blocks_used = bm.n_used();
  snap_.blocks_cached = bm.n_cached();
  snap_.blocks_free = bm.n_free() - bm.n_cached();
  snap_.blocks_total = bm.n_blocks();
  snap_.prompt_tokens = st.prompt_tokens;
  snap_.generated_tokens = st.generated_tokens;
  snap_.cache_hit_tokens = bm.hit_tokens();
  snap_.preemptions = engine_.scheduler().n_preemptions();
  snap_.steps = st.steps;
  snap_.busy_seconds = busy_seconds_;
  snap_.decode_seconds = st.decode_seconds;
  snap_.prefill_seconds = st.prefill_seconds;
  snap_.draft_tokens = st.draft_tokens;
  snap_.accepted_tokens = st.accepted_tokens;
  snap_.verifies = st.verifies;
  snap_.ssd_on = engine_.ssd() != nullptr;
  if (snap_.ssd_on) snap_.ssd = engine_.ssd()->stats();
}

void EngineThread::loop() {
  for (;;) {
    std::deque<Pending> adds;
    std::vector<std::pair<std::shared_ptr<Channel>, int>> cancels;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !pending_.empty() || !cancels_.empty() || engine_.has_work(); });
      if (stop_) break;
      adds.swap(pending_);
      cancels.swap(cancels_);
    }
    for (auto& p : adds) {
      auto ch = p.ch;
      int choice = p.choice;
      p.request.on_event = [this, ch, choice](const TokenEvent& e) {
        if (e.finished) std::erase_if(live_, [&](const Live& l) { return l.id == e.request_id; });
        ch->push(choice, e);
      };
      try {
        int64_t id = engine_.add(std::move(p.request));
        live_.push_back({id, ch, choice});
      } catch (const std::exception& e) {
        ch->push(choice, make_event(0, -1, true, FinishReason::error, e.what()));
      }
    }
    for (auto& [ch, choice] : cancels) {
      std::vector<int64_t> ids;
      for (auto& l : live_)
        if (l.ch == ch && (choice < 0 || l.choice == choice)) ids.push_back(l.id);
      for (int64_t id : ids) engine_.cancel(id);  // the callback removes it from live_
    }
    if (engine_.has_work()) {
      auto t0 = std::chrono::steady_clock::now();
      try {
        engine_.step();
      } catch (const std::exception& e) {
        log::warn("engine step failed: {}", e.what());
        engine_.abort_all(std::string("the engine failed: ") + e.what());
      }
      busy_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    refresh_snapshot();
  }
  engine_.abort_all("the server is shutting down");
}

}  // namespace kiln::engine
