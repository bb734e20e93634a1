// Perplexity and KL divergence over fixed-length token rows, as mlx_lm.perplexity computes them:
// each row [seq_len] runs as one sequence over its first seq_len - 1 tokens; every position's loss
// is -log p(next token). With a reference model, the same positions also give KL(ref || model) of
// the next-token distributions (the quality gate of a quantized artifact).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/model/model.h"

namespace kiln::eval {

// Per-position statistics, in row order.
struct TokenStats {
  std::vector<double> nll;  // -log p_model(next)
  std::vector<double> kl;   // KL(p_ref || p_model), empty without a reference
};

struct EvalOptions {
  int batch_size = 8;  // rows per forward
  // Called after each batch with (rows done, rows total).
  std::function<void(int, int)> progress;
};

// Runs `m` (and `ref` when not null) over rows (all the same length >= 2, ids < vocab).
// Throws [eval] on ragged rows, ids out of range, a length past max_position_embeddings, or a
// reference whose vocab_size differs.
TokenStats evaluate(model::Model& m, const std::vector<std::vector<int32_t>>& rows, model::Model* ref,
                    const EvalOptions& opt = {});

// log-softmax of logits[0..n) in double (max-shifted).
void log_softmax(const float* logits, int64_t n, std::vector<double>& out);
// KL(p || q) from log-probabilities lp, lq over n outcomes: sum exp(lp) * (lp - lq).
double kl_divergence(const std::vector<double>& lp, const std::vector<double>& lq);

struct Summary {
  double perplexity = 0, perplexity_se = 0;  // exp(mean nll), ppl * sd(nll) / sqrt(n) (delta method)
  int64_t n_tokens = 0;
  double kl_mean = 0, kl_p99 = 0;  // 0 without a reference
};
Summary summarize(const TokenStats& s);
// The q-quantile (0..1) of v by linear interpolation between order statistics (numpy's default).
double quantile(std::vector<double> v, double q);

// mlx_lm.perplexity's data: documents visited in a seeded random order (shuffled_order), their
// tokens concatenated until sequence_length * num_samples are gathered, cut into rows (cut_rows).
std::vector<size_t> shuffled_order(size_t n, uint64_t seed);
// Rows of sequence_length consecutive tokens of data (the tail shorter than a row is dropped); the
// first num_samples rows (num_samples <= 0: all). Throws [eval] when sequence_length < 2.
std::vector<std::vector<int32_t>> cut_rows(const std::vector<int32_t>& data, int sequence_length, int num_samples);

}  // namespace kiln::eval
