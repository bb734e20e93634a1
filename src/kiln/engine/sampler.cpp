// Sampler. Filters run on (logit, id) pairs sorted once by logit; probabilities come from a
// max-subtracted softmax at the given temperature.
#include "kiln/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

namespace kiln::engine {

Sampler::Sampler(SamplingParams p) : params_(std::move(p)) {
  rng_.seed(params_.seed ? *params_.seed : std::random_device{}());
}

int32_t argmax(std::span<const float> v) {
  int32_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int32_t>(i);
  return best;
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
  if (params_.temperature <= 0.0f) return argmax(logits);

  // Candidates sorted by logit, descending; top-k truncates first (as HF's warper order).
  auto& c = scratch_;
  c.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i]) || logits[i] > 0) c.emplace_back(logits[i], static_cast<int32_t>(i));
  if (c.empty()) return argmax(logits);
  size_t k = params_.top_k > 0 ? std::min<size_t>(params_.top_k, c.size()) : c.size();
  std::partial_sort(c.begin(), c.begin() + k, c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  c.resize(k);

  // Softmax at the temperature.
  const float inv_t = 1.0f / params_.temperature, m = c[0].first;
  std::vector<double> prob(c.size());
  double sum = 0;
  for (size_t i = 0; i < c.size(); ++i) sum += prob[i] = std::exp(static_cast<double>((c[i].first - m) * inv_t));
  for (auto& q : prob) q /= sum;

  // min-p: relative to the most likely token.
  size_t keep = c.size();
  if (params_.min_p > 0.0f) {
    double floor = params_.min_p * prob[0];
    size_t j = 1;
    while (j < keep && prob[j] >= floor) ++j;
    keep = j;
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (params_.top_p < 1.0f) {
    double acc = 0;
    size_t j = 0;
    while (j < keep) {
      acc += prob[j++];
      if (acc >= params_.top_p) break;
    }
    keep = std::max<size_t>(1, j);
  }
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += prob[i];
  double r = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r <= 0) return c[i].second;
  }
  return c[keep - 1].second;
}

backend::SampleParams device_sample_params(const SamplingParams& p, double uniform) {
  backend::SampleParams d;
  d.temperature = p.temperature;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.top_k = p.top_k;
  d.repetition_penalty = p.repetition_penalty;
  d.presence_penalty = p.presence_penalty;
  d.frequency_penalty = p.frequency_penalty;
  d.uniform = uniform;
  return d;
}

}  // namespace kiln::engine
