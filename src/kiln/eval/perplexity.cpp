// Perplexity / KL evaluation (perplexity.h). A batch of rows runs as one ragged forward over the
// paged KV cache (each row its own sequence, logits for every position) through the engine's
// ModelRunner, the same path as generation. Shapes: logits [n_rows_in_batch * (seq_len - 1), vocab] f32 on the host.
#include "kiln/eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kiln/base/error.h"
#include "kiln/engine/model_runner.h"

namespace kiln::eval {

void log_softmax(const float* x, int64_t n, std::vector<double>& out) {
  out.resize(n);
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(s);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(x[i]) - lse;
}

double kl_divergence(const std::vector<double>& lp, const std::vector<double>& lq) {
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    const double p = std::exp(lp[i]);
    if (p > 0) kl += p * (lp[i] - lq[i]);
  }
  return std::max(kl, 0.0);  // rounding can leave -1e-17 for identical distributions
}

namespace {

constexpr int kBlockSize = 16;

// One forward of rows [b, e), each over its first len tokens; logits [(e - b) * len, vocab].
Tensor forward_rows(model::Model& m, const std::vector<std::vector<int32_t>>& rows, size_t b, size_t e, int len) {
  const int n_seqs = static_cast<int>(e - b);
  const int blocks_per_seq = (len + kBlockSize - 1) / kBlockSize;
  model::KvCache cache = model::KvCache::allocate(m.backend(), m.config(), n_seqs * blocks_per_seq, kBlockSize);
  std::vector<int32_t> tables(static_cast<size_t>(n_seqs) * blocks_per_seq);
  std::iota(tables.begin(), tables.end(), 0);  // row s holds blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq)
  std::vector<engine::SeqChunk> chunks(n_seqs);
  for (int s = 0; s < n_seqs; ++s) {
    chunks[s].tokens = std::span<const int32_t>(rows[b + s]).first(len);
    chunks[s].n_tokens = chunks[s].n_logits = len;
    chunks[s].blocks = std::span<const int32_t>(tables).subspan(static_cast<size_t>(s) * blocks_per_seq, blocks_per_seq);
  }
  return engine::ModelRunner(m, cache).logits(chunks);
}

}  // namespace

TokenStats evaluate(model::Model& m, const std::vector<std::vector<int32_t>>& rows, model::Model* ref,
                    const EvalOptions& opt) {
  TokenStats st;
  if (rows.empty()) return st;
  const size_t seq_len = rows[0].size();
  const int vocab = m.config().vocab_size;
  if (seq_len < 2) fail("eval", "rows need at least 2 tokens, got {}", seq_len);
  for (const auto& r : rows) {
    if (r.size() != seq_len) fail("eval", "rows must all have {} tokens; one has {}", seq_len, r.size());
    for (int32_t id : r)
      if (id < 0 || id >= vocab) fail("eval", "token id {} is outside the model's vocabulary of {}", id, vocab);
  }
  const int len = static_cast<int>(seq_len) - 1;
  if (m.config().max_position_embeddings > 0 && len > m.config().max_position_embeddings)
    fail("eval", "--sequence-length {} exceeds the model's max_position_embeddings {}", seq_len,
         m.config().max_position_embeddings);
  if (ref && ref->config().vocab_size != vocab)
    fail("eval", "the reference model's vocab_size {} differs from the model's {}: KL needs the same vocabulary",
         ref->config().vocab_size, vocab);
  const int bs = std::max(1, opt.batch_size);
  std::vector<double> lp, lq;
  for (size_t b = 0; b < rows.size(); b += bs) {
    const size_t e = std::min(rows.size(), b + bs);
    Tensor logits = forward_rows(m, rows, b, e, len);  // [(e-b) * len, vocab]
    Tensor ref_logits;
    if (ref) ref_logits = forward_rows(*ref, rows, b, e, len);
    for (size_t s = 0; s < e - b; ++s) {
      for (int p = 0; p < len; ++p) {
        const int64_t row = static_cast<int64_t>(s) * len + p;
        log_softmax(logits.ptr<float>() + row * vocab, vocab, lq);
        const int32_t next = rows[b + s][p + 1];
        st.nll.push_back(-lq[next]);
        if (ref) {
          log_softmax(ref_logits.ptr<float>() + row * vocab, vocab, lp);
          st.kl.push_back(kl_divergence(lp, lq));
        }
      }
    }
    if (opt.progress) opt.progress(static_cast<int>(e), static_cast<int>(rows.size()));
  }
  return st;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

Summary summarize(const TokenStats& s) {
  Summary r;
  r.n_tokens = static_cast<int64_t>(s.nll.size());
  if (s.nll.empty()) return r;
  const double n = static_cast<double>(s.nll.size());
  const double mean = std::accumulate(s.nll.begin(), s.nll.end(), 0.0) / n;
  double var = 0;
  for (double x : s.nll) var += (x - mean) * (x - mean);
  var = s.nll.size() > 1 ? var / (n - 1) : 0;  // ddof = 1, as mlx_lm.perplexity
  r.perplexity = std::exp(mean);
  r.perplexity_se = r.perplexity * std::sqrt(var) / std::sqrt(n);
  if (!s.kl.empty()) {
    r.kl_mean = std::accumulate(s.kl.begin(), s.kl.end(), 0.0) / static_cast<double>(s.kl.size());
    r.kl_p99 = quantile(s.kl, 0.99);
  }
  return r;
}

std::vector<size_t> shuffled_order(size_t n, uint64_t seed) {
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 gen(seed);
  std::shuffle(perm.begin(), perm.end(), gen);
  return perm;
}

std::vector<std::vector<int32_t>> cut_rows(const std::vector<int32_t>& data, int sequence_length, int num_samples) {
  if (sequence_length < 2) fail("eval", "--sequence-length must be at least 2, got {}", sequence_length);
  std::vector<std::vector<int32_t>> rows;
  const size_t L = static_cast<size_t>(sequence_length);
  for (size_t b = 0; b + L <= data.size(); b += L) {
    if (num_samples > 0 && rows.size() >= static_cast<size_t>(num_samples)) break;
    rows.emplace_back(data.begin() + b, data.begin() + b + L);
  }
  return rows;
}

}  // namespace kiln::eval
