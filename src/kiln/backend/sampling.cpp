// sample_row / apply_adjust (sampling.h) and Backend::sample_rows' default: the reference
// semantics of sampling, on host-readable logits. Filters run on (logit, id) pairs sorted once by
// logit; probabilities come from a max-subtracted softmax at the given temperature.
#include "kiln/backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::backend {

int32_t argmax(std::span<const float> v) {
  int32_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = static_cast<int32_t>(i);
  return best;
}

void apply_adjust(const LogitAdjust& a, const SampleParams& p, std::span<float> logits) {
  if (a.token < 0 || a.token >= static_cast<int32_t>(logits.size())) return;
  float& l = logits[a.token];
  l += a.bias;
  if (a.in_context && p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
  if (a.n_generated > 0) l -= p.presence_penalty + p.frequency_penalty * a.n_generated;
}

void kept_candidates(std::span<const float> logits, const SampleParams& p, std::vector<std::pair<float, int32_t>>& c,
                     std::vector<double>& prob) {
  // Candidates sorted by logit, descending; top-k truncates first (as HF's warper order).
  c.clear();
  prob.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i]) || logits[i] > 0) c.emplace_back(logits[i], static_cast<int32_t>(i));
  if (c.empty()) return;
  size_t k = p.top_k > 0 ? std::min<size_t>(p.top_k, c.size()) : c.size();
  std::partial_sort(c.begin(), c.begin() + k, c.end(),
                    [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  c.resize(k);

  // Softmax at the temperature.
  const float inv_t = 1.0f / p.temperature, m = c[0].first;
  prob.resize(c.size());
  double sum = 0;
  for (size_t i = 0; i < c.size(); ++i) sum += prob[i] = std::exp(static_cast<double>((c[i].first - m) * inv_t));
  for (auto& q : prob) q /= sum;

  // min-p: relative to the most likely token.
  size_t keep = c.size();
  if (p.min_p > 0.0f) {
    double floor = p.min_p * prob[0];
    size_t j = 1;
    while (j < keep && prob[j] >= floor) ++j;
    keep = j;
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (p.top_p < 1.0f) {
    double acc = 0;
    size_t j = 0;
    while (j < keep) {
      acc += prob[j++];
      if (acc >= p.top_p) break;
    }
    keep = std::max<size_t>(1, j);
  }
  c.resize(keep);
  prob.resize(keep);
}

int32_t sample_row(std::span<const float> logits, const SampleParams& p, const std::function<double()>& uniform,
                   std::vector<std::pair<float, int32_t>>& c) {
  if (p.temperature <= 0.0f) return argmax(logits);
  std::vector<double> prob;
  kept_candidates(logits, p, c, prob);
  if (c.empty()) return argmax(logits);
  double mass = 0;
  for (double q : prob) mass += q;
  // uniform() * mass is the value std::uniform_real_distribution(0, mass) draws from the same
  // generator state (libstdc++: canonical * (b - a) + a), so host and device streams agree.
  double r = uniform() * mass;
  for (size_t i = 0; i < c.size(); ++i) {
    r -= prob[i];
    if (r <= 0) return c[i].second;
  }
  return c.back().second;
}

void check_masks(const std::string& backend, const TokenMasks& m, int64_t rows, int64_t vocab) {
  if (m.empty()) return;
  if (m.n_words < (vocab + 31) / 32 || m.words.size() != m.rows.size() * static_cast<size_t>(m.n_words))
    fail(backend, "sample_rows: {} masks of {} words ({} in all) for a vocabulary of {}", m.rows.size(), m.n_words,
         m.words.size(), vocab);
  for (int32_t r : m.rows)
    if (r < 0 || r >= rows) fail(backend, "sample_rows: a mask names row {} of {}", r, rows);
}

void Backend::sample_rows(Tensor& logits, const std::vector<SampleParams>& params,
                          const std::vector<LogitAdjust>& adjust, Tensor& ids, const TokenMasks& masks) {
  if (logits.device != Device::cpu || logits.dtype != DType::f32 || logits.ndim() != 2)
    fail(name(), "sample_rows: logits must be float32 [rows, vocab] in host memory, got {} {}", dtype_name(logits.dtype),
         shape_str(logits.shape));
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  if (ids.device != Device::cpu || ids.dtype != DType::i32 || ids.numel() != rows)
    fail(name(), "sample_rows: ids must be int32 [{}] in host memory, got {} {}", rows, dtype_name(ids.dtype),
         shape_str(ids.shape));
  if (static_cast<int64_t>(params.size()) != rows)
    fail(name(), "sample_rows: {} parameter sets for {} rows", params.size(), rows);
  auto row = [&](int64_t r) { return std::span<float>(logits.ptr<float>() + r * vocab, vocab); };
  check_masks(name(), masks, rows, vocab);
  for (size_t i = 0; i < masks.rows.size(); ++i) {
    const uint32_t* w = masks.words.data() + i * masks.n_words;
    std::span<float> l = row(masks.rows[i]);
    for (int64_t t = 0; t < vocab; ++t)
      if (!((w[t >> 5] >> (t & 31)) & 1u)) l[t] = -std::numeric_limits<float>::infinity();
  }
  for (const LogitAdjust& a : adjust) {
    if (a.row < 0 || a.row >= rows) fail(name(), "sample_rows: an adjustment names row {} of {}", a.row, rows);
    apply_adjust(a, params[a.row], row(a.row));
  }
  std::vector<std::pair<float, int32_t>> scratch;
  for (int64_t r = 0; r < rows; ++r) {
    const double u = params[r].uniform;
    if (!(u >= 0.0 && u < 1.0)) fail(name(), "sample_rows: row {}: uniform {} is not in [0, 1)", r, u);
    ids.ptr<int32_t>()[r] = sample_row(row(r), params[r], [u] { return u; }, scratch);
  }
}

}  // namespace kiln::backend
