// Scheduler::schedule — token budget, admission by free blocks, preemption by recompute.
#include "kiln/engine/scheduler.h"

#include <algorithm>

namespace kiln::engine {

void Scheduler::preempt(Sequence* s) {
  blocks_.release(s->blocks);
  s->n_computed = 0;
  ++s->n_preempted;
  ++n_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), s));
  waiting_.push_front(s);
}

void Scheduler::remove(Sequence* seq) {
  blocks_.release(seq->blocks);
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> out;
  int budget = cfg_.max_batch_tokens;
  // 1. Running sequences, oldest first. If one cannot get blocks, preempt the newest others.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    int n = std::min(s->n_pending(), budget);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool ok = blocks_.ensure(s->blocks, s->n_computed + n);
    while (!ok && running_.back() != s) {
      preempt(running_.back());
      ok = blocks_.ensure(s->blocks, s->n_computed + n);
    }
    if (!ok) {  // s is the newest and still does not fit: it waits for others to finish
      preempt(s);
      break;
    }
    out.push_back({s, n, s->n_computed + n == static_cast<int>(s->tokens.size())});
    budget -= n;
    ++i;
  }
  // 2. Admit waiting sequences while there is budget, room, and blocks for their first chunk.
  while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < cfg_.max_seqs) {
    Sequence* s = waiting_.front();
    int n = std::min(s->n_pending(), budget);
    if (!blocks_.ensure(s->blocks, s->n_computed + n)) break;
    waiting_.pop_front();
    running_.push_back(s);
    out.push_back({s, n, s->n_computed + n == static_cast<int>(s->tokens.size())});
    budget -= n;
  }
  return out;
}

}  // namespace kiln::engine
