// One generation request as the engine sees it: its tokens (prompt then output), how many of
// them already have K/V in the cache, its KV blocks, sampler and stop conditions.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/engine/grammar_constraint.h"
#include "kiln/engine/sampler.h"

namespace kiln::engine {

enum class FinishReason { none, stop, length, cancelled, error };
const char* finish_reason_name(FinishReason r);

// What the engine reports after each sampled token (called on the engine thread).
struct TokenEvent {
  int64_t request_id = 0;
  int32_t token = -1;          // -1 when the event only reports the end
  bool finished = false;
  FinishReason reason = FinishReason::none;
  std::string error;           // when reason == error
  float logprob = 0.0f;                   // of `token`, when Request::logprobs >= 0
  std::vector<TokenLogprob> top;          // [Request::logprobs] most likely first
  // With the first event only, when Request::prompt_logprobs >= 0: one entry per prompt token;
  // entry 0 has no predecessor and stays empty (token -1). Each entry is the token itself, then
  // the top alternatives.
  std::vector<std::vector<TokenLogprob>> prompt_logprobs;
  int n_cached = 0;            // prompt tokens whose K/V came from the prefix cache
  int n_cached_ssd = 0;        // of those, the ones read back from the SSD tier
  int draft_n = 0, draft_n_accepted = 0;  // speculative decoding so far: tokens drafted, accepted
};
inline TokenEvent make_event(int64_t id, int32_t token, bool finished, FinishReason r, std::string error = {}) {
  TokenEvent e;
  e.request_id = id;
  e.token = token;
  e.finished = finished;
  e.reason = r;
  e.error = std::move(error);
  return e;
}

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 256;
  std::vector<int32_t> stop_ids;  // EOS ids: generation ends when one is sampled (it is reported)
  int logprobs = -1;         // >= 0: report each sampled token's logprob and this many alternatives
  int prompt_logprobs = -1;  // >= 0: report every prompt token's logprob (needs all prompt logits)
  bool reuse_prefix = true;  // may start from cached prefix blocks
  int num_draft_tokens = -1; // speculative decoding: at most this many drafts per step (0: off; -1: the engine's)
  // Structured output: the output must be a sentence of this grammar (grammar_constraint.h); the
  // stop ids above end it once the grammar is complete. Null: unconstrained.
  std::shared_ptr<const grammar::TokenMasker> grammar;
  std::function<void(const TokenEvent&)> on_event;
};

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int n_prompt = 0;
  int n_computed = 0;           // tokens whose K/V are in the cache
  std::vector<int32_t> blocks;  // KV block table
  Sampler sampler;
  int max_tokens = 0;
  std::vector<int32_t> stop_ids;
  std::function<void(const TokenEvent&)> on_event;
  FinishReason finish = FinishReason::none;
  int n_preempted = 0;
  int logprobs = -1, prompt_logprobs = -1;
  bool reuse_prefix = true;
  int n_cached = -1;                  // prompt tokens reused from the prefix cache (-1: not admitted yet)
  int n_cached_ssd = 0;               // of those, read back from the SSD tier
  int ssd_checked = -1;               // n_preempted when the SSD tier was last asked for this prefix
  std::vector<uint64_t> block_hashes; // the prefix cache's hash chain memo (BlockManager)
  int n_committed_blocks = 0;         // full blocks registered in the prefix cache
  std::vector<std::vector<TokenLogprob>> prompt_lp;  // [n_prompt] when prompt_logprobs >= 0
  int num_draft_tokens = -1;
  int draft_n = 0, draft_n_accepted = 0;
  std::unique_ptr<GrammarConstraint> grammar;  // Request::grammar's state, or null
  std::vector<LogitsProcessor*> processors;    // SampleSpec::processors (the grammar's)

  Sequence(int64_t id_, Request r);
  int n_generated() const { return static_cast<int>(tokens.size()) - n_prompt; }
  int n_pending() const { return static_cast<int>(tokens.size()) - n_computed; }
};

}  // namespace kiln::engine
