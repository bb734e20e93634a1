// Scheduler::schedule — token budget, admission by free blocks, preemption by recompute.
#include "kiln/engine/scheduler.h"

#include <algorithm>

namespace kiln::engine {

// Tokens a sequence may run this step. A prefill that returns logits for every position (prompt
// logprobs) runs in chunks of at most kMaxLogitRows, bounding the [rows, vocab] logits it needs.
static int chunk_limit(const Sequence& s) {
  constexpr int kMaxLogitRows = 256;
  if (s.prompt_logprobs >= 0 && s.n_computed < s.n_prompt) return std::min(s.n_pending(), kMaxLogitRows);
  return s.n_pending();
}

void Scheduler::preempt(Sequence* s) {
  blocks_.release(s->blocks);
  s->n_computed = 0;
  s->n_committed_blocks = 0;
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
    int n = std::min(chunk_limit(*s), budget);
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
  //    A sequence starting from scratch first takes the longest cached prefix of its tokens
  //    (always leaving its last token to compute: its logits pick the next token).
  while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < cfg_.max_seqs) {
    Sequence* s = waiting_.front();
    if (s->n_computed == 0 && s->blocks.empty() && s->reuse_prefix && blocks_.prefix_caching()) {
      int max_blocks = (static_cast<int>(s->tokens.size()) - 1) / blocks_.block_size();
      int got = blocks_.acquire_prefix(s->tokens, max_blocks, s->blocks, s->block_hashes);
      s->n_computed = got * blocks_.block_size();
      s->n_committed_blocks = got;  // the blocks after these are fresh: commit them as they fill
    }
    int n = std::min(chunk_limit(*s), budget);
    if (!blocks_.ensure(s->blocks, s->n_computed + n)) {
      blocks_.release(s->blocks);  // give back the cached prefix; it is looked up again next time
      s->n_computed = 0;
      break;
    }
    if (s->n_cached < 0) s->n_cached = std::min(s->n_computed, s->n_prompt);  // first admission
    waiting_.pop_front();
    running_.push_back(s);
    out.push_back({s, n, s->n_computed + n == static_cast<int>(s->tokens.size())});
    budget -= n;
  }
  return out;
}

}  // namespace kiln::engine
