// The scheduler: each step picks sequences and a token count for each within a token budget.
// Running sequences go first (a decode token, or the next prefill chunk), then waiting ones
// are admitted while KV blocks and the sequence limit allow. When blocks run out, the newest
// running sequence is preempted by recompute (its blocks freed, its tokens kept). A sequence
// admitted from scratch first takes the longest cached prefix of its tokens (BlockManager).
// No tensor work: unit-testable without a model.
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "kiln/engine/block_manager.h"
#include "kiln/engine/sequence.h"

namespace kiln::engine {

struct SchedulerConfig {
  int max_batch_tokens = 2048;  // tokens per step, prefill chunks and decodes together
  int max_seqs = 8;             // sequences running at once
};

struct ScheduledChunk {
  Sequence* seq;
  int n_tokens;       // tokens [seq->n_computed, seq->n_computed + n_tokens) run this step
  bool wants_logits;  // the chunk reaches the end of the sequence's tokens
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig cfg, BlockManager& blocks) : cfg_(cfg), blocks_(blocks) {}
  const SchedulerConfig& config() const { return cfg_; }

  void add(Sequence* seq) { waiting_.push_back(seq); }
  // Removes a sequence wherever it is and frees its blocks.
  void remove(Sequence* seq);
  std::vector<ScheduledChunk> schedule();

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  bool empty() const { return waiting_.empty() && running_.empty(); }
  int64_t n_preemptions() const { return n_preemptions_; }

 private:
  void preempt(Sequence* s);

  SchedulerConfig cfg_;
  BlockManager& blocks_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in admission order
  int64_t n_preemptions_ = 0;
};

}  // namespace kiln::engine
