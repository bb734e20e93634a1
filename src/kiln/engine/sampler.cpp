// Sampler: the logit processors (bias, penalties) here, then the reference filters and draw
// (backend/sampling.h), with the sequence's own generator.
#include "kiln/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "kiln/backend/sampling.h"

namespace kiln::engine {

Sampler::Sampler(SamplingParams p) : params_(std::move(p)) {
  rng_.seed(params_.seed ? *params_.seed : std::random_device{}());
}

float log_softmax_at(std::span<const float> logits, int32_t token, int n_top, std::vector<TokenLogprob>* top) {
  float m = logits[argmax(logits)];
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - m));
  const double lse = m + std::log(sum);
  if (top && n_top > 0) {
    size_t k = std::min<size_t>(n_top, logits.size());
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    top->clear();
    for (size_t i = 0; i < k; ++i) top->push_back({ids[i], static_cast<float>(logits[ids[i]] - lse)});
  }
  return static_cast<float>(logits[token] - lse);
}

void apply_penalties(const SamplingParams& p, std::span<float> logits, std::span<const int32_t> context,
                     std::span<const int32_t> generated) {
  const int32_t V = static_cast<int32_t>(logits.size());
  for (auto [id, b] : p.logit_bias)
    if (id >= 0 && id < V) logits[id] += b;
  if (p.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(context.begin(), context.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= V) continue;
      float& l = logits[id];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t id : generated) ++counts[id];
    for (auto [id, n] : counts)
      if (id >= 0 && id < V) logits[id] -= p.presence_penalty + p.frequency_penalty * n;
  }
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> context, std::span<const int32_t> generated) {
  apply_penalties(params_, logits, context, generated);
  return backend::sample_row(logits, device_sample_params(params_, 0.0), [this] { return next_uniform(); }, scratch_);
}

void Sampler::distribution(std::span<float> logits, std::span<const int32_t> context, std::span<const int32_t> generated,
                           std::vector<float>& probs) {
  apply_penalties(params_, logits, context, generated);
  probs.assign(logits.size(), 0.0f);
  if (params_.temperature <= 0.0f) {
    probs[argmax(logits)] = 1.0f;
    return;
  }
  backend::kept_candidates(logits, device_sample_params(params_, 0.0), scratch_, prob_scratch_);
  double mass = 0;
  for (double q : prob_scratch_) mass += q;
  if (scratch_.empty() || !(mass > 0)) {  // no finite logit: what sample_row falls back to
    probs[argmax(logits)] = 1.0f;
    return;
  }
  for (size_t i = 0; i < scratch_.size(); ++i) probs[scratch_[i].second] = static_cast<float>(prob_scratch_[i] / mass);
}

int32_t Sampler::draw(std::span<const float> probs) {
  double r = next_uniform(), acc = 0;
  int32_t last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    acc += probs[i];
    last = static_cast<int32_t>(i);
    if (r < acc) return last;
  }
  return last >= 0 ? last : 0;  // rounding left r past the sum: the last token with mass
}

backend::SampleParams device_sample_params(const SamplingParams& p, double uniform) {
  return {.temperature = p.temperature, .top_p = p.top_p, .min_p = p.min_p, .top_k = p.top_k,
          .repetition_penalty = p.repetition_penalty, .presence_penalty = p.presence_penalty,
          .frequency_penalty = p.frequency_penalty, .uniform = uniform};
}

}  // namespace kiln::engine
