// One generation request as the engine sees it: its tokens (prompt then output), how many of
// them already have K/V in the cache, its KV blocks, sampler and stop conditions.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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
};

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 256;
  std::vector<int32_t> stop_ids;  // EOS ids: generation ends when one is sampled (it is reported)
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

  Sequence(int64_t id_, Request r);
  int n_generated() const { return static_cast<int>(tokens.size()) - n_prompt; }
  int n_pending() const { return static_cast<int>(tokens.size()) - n_computed; }
};

}  // namespace kiln::engine
