// Token sampling for one sequence: logit bias, repetition/presence/frequency penalties,
// temperature, then top-k, top-p and min-p filters; greedy when temperature is 0.
// The same seed gives the same tokens.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "kiln/backend/sampling.h"

namespace kiln::engine {

struct SamplingParams {
  float temperature = 0.0f;        // 0: greedy
  float top_p = 1.0f;              // keep the smallest set with cumulative probability >= top_p
  int top_k = 0;                   // 0: off
  float min_p = 0.0f;              // drop tokens with p < min_p * p_max
  float repetition_penalty = 1.0f; // HF: logits of seen tokens divided (>0) or multiplied (<0)
  float presence_penalty = 0.0f;   // OpenAI: minus this once for every token seen in the output
  float frequency_penalty = 0.0f;  // OpenAI: minus this times the count in the output
  std::map<int32_t, float> logit_bias;
  std::optional<uint64_t> seed;
};

// p as the device sampler's per-row parameters (Backend::sample_rows) with the row's draw `uniform`
// (logit_bias and the penalties' token counts travel separately, as LogitAdjust entries).
backend::SampleParams device_sample_params(const SamplingParams& p, double uniform);

// Greedy without logit bias or penalties: the argmax of the raw logits (the device takes it).
inline bool plain_greedy(const SamplingParams& p) {
  return p.temperature <= 0.0f && p.logit_bias.empty() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

class Sampler {
 public:
  explicit Sampler(SamplingParams p);
  const SamplingParams& params() const { return params_; }
  // logits: [vocab] (modified in place). context: the prompt and tokens so far (repetition penalty);
  // generated: only the output tokens (presence/frequency penalties).
  int32_t sample(std::span<float> logits, std::span<const int32_t> context, std::span<const int32_t> generated);
  // The draw sample() would make next, in [0, 1), for sampling on the device (Backend::sample_rows):
  // advances the generator exactly as a host sample() at temperature > 0 does, so the stream of a
  // seed is the same whichever side samples.
  double next_uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  // The distribution sample() draws from: penalties applied to logits in place, then probs [vocab]
  // normalized over the kept candidates (zero elsewhere); greedy: one-hot at the argmax.
  void distribution(std::span<float> logits, std::span<const int32_t> context, std::span<const int32_t> generated,
                    std::vector<float>& probs);
  // A token drawn from probs [vocab] (summing to 1) with one draw of the generator.
  int32_t draw(std::span<const float> probs);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;
  std::vector<double> prob_scratch_;
};

// A token's log-probability. Sampled tokens are scored under the processed logits (after logit
// bias and penalties, before temperature and the top-k/p filters), as OpenAI's logprobs report them.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

// log_softmax(logits)[token]; when n_top > 0 also fills `top` with the n_top most likely tokens,
// most likely first (ties: the lower id first).
float log_softmax_at(std::span<const float> logits, int32_t token, int n_top, std::vector<TokenLogprob>* top);

// Applies the logit processors (bias and penalties) only; sample() calls it first.
void apply_penalties(const SamplingParams& p, std::span<float> logits, std::span<const int32_t> context,
                     std::span<const int32_t> generated);
// Index of the largest value (the first one on ties, as torch.argmax).
using backend::argmax;

}  // namespace kiln::engine
