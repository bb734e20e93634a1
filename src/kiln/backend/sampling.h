// The reference of token sampling over one row of logits (the host Sampler and the CPU's
// Backend::sample_rows use it; the CUDA sampler is tested against it): logit adjustments, then
// temperature, top-k, min-p and top-p over the tokens ranked by logit, then one draw.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backend/backend.h"

namespace kiln::backend {

// Index of the largest value (the first one on ties, as torch.argmax).
int32_t argmax(std::span<const float> v);

// Applies one LogitAdjust to its row `logits` [vocab]: + bias, then the repetition penalty when
// in_context (divide a positive logit, multiply a negative one), then - (presence + frequency *
// n_generated) when n_generated > 0.
void apply_adjust(const LogitAdjust& a, const SampleParams& p, std::span<float> logits);

// The candidates sample_row draws from, for temperature > 0: (logit, id) pairs in rank order (by
// logit, ties to the lower id) cut by top-k, then min-p (relative to the most likely) and the
// smallest top-p prefix, with their probabilities at the temperature over the top-k set (not
// renormalized: their sum is the kept mass). Empty when no logit is finite.
void kept_candidates(std::span<const float> logits, const SampleParams& p, std::vector<std::pair<float, int32_t>>& c,
                     std::vector<double>& prob);

// A token from logits [vocab] (already adjusted) under p: argmax when temperature <= 0; else the
// candidates sorted by logit (ties: lower id first), top-k, softmax at the temperature, min-p
// relative to the most likely, the smallest top-p prefix, then r = uniform() * kept mass picks the
// token. `uniform` is called once, only when a draw happens (so a generator advances as it would
// on the host); `scratch` is reused between calls.
int32_t sample_row(std::span<const float> logits, const SampleParams& p, const std::function<double()>& uniform,
                   std::vector<std::pair<float, int32_t>>& scratch);

// Throws unless masks fit rows x vocab (the word count, the row indices).
void check_masks(const std::string& backend, const TokenMasks& masks, int64_t rows, int64_t vocab);

}  // namespace kiln::backend
