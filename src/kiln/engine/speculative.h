// Speculative decoding: a DraftSource proposes up to n tokens after a sequence's last token; the
// engine verifies them in one target forward over [pending, d_1..d_n] (inside the ordinary ragged
// batch) and keeps the accepted prefix plus one token of its own (the correction, or the bonus
// when all were accepted). Here: the source interface, its two sources (a draft model with its
// own paged KV, and prompt lookup), the acceptance rules, and the policy that picks n per step.
#pragma once
#include <array>
#include <climits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/engine/block_manager.h"
#include "kiln/engine/loader.h"
#include "kiln/engine/model_runner.h"
#include "kiln/engine/sampler.h"

namespace kiln::engine {

struct Sequence;

// How a sampled (temperature > 0) target accepts a draft token. Both keep the target's
// distribution exactly; greedy requests accept on an exact match under either.
// The most draft tokens a sequence may take per step (flags, requests): a verify of 1 + 16 rows is
// still a uniform, graphed step.
constexpr int kMaxDraftTokens = ModelRunner::kMaxUniformTokens - 1;

enum class SpecAccept {
  residual,  // accept d with min(1, p(d)/q(d)), else draw from norm(max(0, p - q)) (Leviathan et al.)
  exact,     // mlx-lm: draw y ~ p at each position, accept while y == d (fewer accepted)
};
const char* spec_accept_name(SpecAccept a);

// Proposed tokens for one sequence, and the draft's distribution at each of them (dense [vocab]
// rows, for the residual rule); no rows: each token came with probability 1 (lookup, greedy draft).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> probs;
};

struct DraftAsk {
  const Sequence* seq = nullptr;  // propose after seq->tokens (the last one has no K/V yet)
  int n = 0;                      // at most this many tokens
  bool probs = false;             // sampled drafts carry their distributions (the residual rule)
  Draft* out = nullptr;
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  virtual std::string name() const = 0;
  // The engine's KV pool has room for n_blocks blocks of block_size tokens of this source too
  // (kv_bytes per block was counted in its sizing): sources with a cache allocate it here.
  virtual void reserve(int n_blocks, int block_size) {}
  // The prompts of these sequences are now in the target's cache (their next step decodes).
  virtual void prefill(std::span<const Sequence* const> seqs) {}
  // Fills every ask's draft (fewer tokens, or none, where the source has nothing to offer).
  virtual void propose(std::span<const DraftAsk> asks) = 0;
  // Of n_drafted proposed tokens, the first n_accepted were kept and one more token followed: s's
  // tokens now end with them. Positions past the accepted ones are stale in the source's state.
  virtual void commit(const Sequence& s, int n_drafted, int n_accepted) {}
  // The sequence ended (or was preempted): its state goes.
  virtual void forget(int64_t seq_id) {}
  // Resident bytes of the source's weights, and of its KV for n_tokens (admission, KV sizing).
  virtual size_t weight_bytes() const { return 0; }
  virtual size_t kv_bytes(int n_tokens) const { return 0; }
  // Per-step buffers its forwards may take beside the target's (KV sizing on a GPU).
  virtual size_t activation_bytes(int max_batch_tokens) const { return 0; }
  // Sequences longer than this get no drafts (a draft model's context).
  virtual int max_context() const { return INT_MAX; }
};

// Prompt lookup: the longest suffix of the sequence (max_match down to min_match tokens) that
// occurred before, most recent occurrence first; proposes the tokens that followed it.
std::unique_ptr<DraftSource> make_ngram_draft(int min_match = 2, int max_match = 4);

// A second model drafting autoregressively with each request's own sampling parameters, in its
// own paged KV cache. Fails (naming the first differing token) unless its tokenizer equals the
// target's; a config vocab_size that differs only in padding is a warning.
std::unique_ptr<DraftSource> make_draft_model(LoadedModel& draft, const LoadedModel& target, int max_batch_tokens = 2048);
// The tokenizer check alone (the error make_draft_model raises).
void check_draft_tokenizer(const LoadedModel& draft, const LoadedModel& target);

// The outcome of verifying one sequence's draft: the tokens to emit (accepted drafts, then the
// correction or bonus) and how many drafts were accepted. rows[j] are the target's processed
// logits for the token after context + drafts[0..j) (j = 0..n), each modified in place.
struct Verdict {
  std::vector<int32_t> tokens;  // n_accepted + 1 tokens
  int n_accepted = 0;
};
// Greedy: accept while argmax(rows[j]) == drafts[j]; the argmax at the first miss follows.
Verdict accept_greedy(std::span<const int32_t> row_argmax, std::span<const int32_t> drafts);
// Sampled: the rule over dense target probabilities p[j] [vocab] and the draft's (q empty: point
// masses at the drafts), drawing with `sampler` (its generator).
Verdict accept_sampled(SpecAccept rule, std::span<std::vector<float>> p, const Draft& d, Sampler& sampler);

// Picks the draft length per step from measured throughput: for each batch-size bucket (1, 2,
// 3-4, ..., 65+), a moving average of tokens emitted per second for each n in 0..max_n; the best is
// used, plain decoding (n = 0) every kBaselineEvery steps keeps its rate current, and a neighbour
// of the best is tried every kProbeEvery steps (twice as rarely after each probe that loses). A compute-bound batch (where verifying extra
// tokens costs nearly as much as decoding them) or drafts that are rejected make n = 0 the best,
// so drafting stops by itself; it resumes when a probe measures a gain.
class SpecPolicy {
 public:
  static constexpr int kProbeEvery = 32, kMaxProbeEvery = 1024, kBaselineEvery = 8;
  explicit SpecPolicy(int max_n) : max_n_(max_n) {}
  // The draft length for a step of batch_size decoding sequences.
  int choose(int batch_size);
  // A decode step (no prefill) with this batch size and draft length emitted `tokens` in `seconds`.
  void record(int batch_size, int n, int tokens, double seconds);

 private:
  static constexpr int kBuckets = 8;
  static int bucket(int batch_size);
  struct Arm {
    double rate = 0;
    int count = 0;
  };
  struct Bucket {
    std::vector<Arm> arms;  // [max_n + 1]
    int step = 0, next_probe = kProbeEvery, interval = kProbeEvery, probing = -1;
  };
  Bucket& at(int batch_size);
  static int best(const Bucket& b);
  int max_n_;
  std::array<Bucket, kBuckets> buckets_;
};

}  // namespace kiln::engine
