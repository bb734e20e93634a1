// eval::: the math (log-softmax, KL, numpy's quantile, mlx_lm.perplexity's mean/SE), the data cut
// into rows, and evaluate() on the real stories260K: KL of a model against itself is 0, batching
// rows does not change the losses, the per-token loss equals -log softmax of a direct forward, and
// bad rows fail by name. The quantized KV cache against the float one: KL of the next-token
// distributions over real text on stories260K and on a `kiln synth` llama-100m, at 8 and 4 bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "../model_test_util.h"
#include "kiln/eval/perplexity.h"
#include "kiln/backend/kv_quant.h"
#include "kiln/tokenizer/tokenizer.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

using namespace kiln;

namespace {

const std::string kStories = std::string(KILN_SHARED_DIR) + "/models/stories260K";

using Loaded = test::LoadedModel;
std::unique_ptr<Loaded> load(const std::string& dir) { return test::load_model_dir(dir); }

std::vector<std::vector<int32_t>> some_rows(int n_rows, int len, int vocab) {
  std::vector<std::vector<int32_t>> rows(n_rows);
  for (int r = 0; r < n_rows; ++r)
    for (int i = 0; i < len; ++i) rows[r].push_back((r * 131 + i * i * 7 + 3) % vocab);
  return rows;
}

}  // namespace

TEST(EvalMath, LogSoftmaxAndKl) {
  const float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<double> lp;
  eval::log_softmax(x, 4, lp);
  double s = 0;
  for (double v : lp) s += std::exp(v);
  EXPECT_NEAR(s, 1.0, 1e-12);
  EXPECT_NEAR(lp[3] - lp[0], 3.0, 1e-12);
  const float big[2] = {1000.0f, 1000.0f};  // max-shifted: no overflow
  eval::log_softmax(big, 2, lp);
  EXPECT_NEAR(lp[0], std::log(0.5), 1e-12);
  std::vector<double> p = {std::log(0.5), std::log(0.5)}, q = {std::log(0.9), std::log(0.1)};
  EXPECT_NEAR(eval::kl_divergence(p, q), 0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(0.5 / 0.1), 1e-12);
  EXPECT_EQ(eval::kl_divergence(p, p), 0.0);
  EXPECT_GT(eval::kl_divergence(q, p), 0.0);
}

TEST(EvalMath, QuantileAndSummary) {
  EXPECT_NEAR(eval::quantile({4, 1, 3, 2}, 0.99), 3.97, 1e-12);  // numpy: linear between order stats
  EXPECT_EQ(eval::quantile({4, 1, 3, 2}, 0.0), 1.0);
  EXPECT_EQ(eval::quantile({4, 1, 3, 2}, 1.0), 4.0);
  eval::TokenStats st;
  st.nll = {1.0, 2.0, 3.0};
  st.kl = {0.0, 0.5, 1.0};
  eval::Summary s = eval::summarize(st);
  EXPECT_NEAR(s.perplexity, std::exp(2.0), 1e-12);
  EXPECT_NEAR(s.perplexity_se, std::exp(2.0) * 1.0 / std::sqrt(3.0), 1e-12);  // sd (ddof 1) = 1
  EXPECT_NEAR(s.kl_mean, 0.5, 1e-12);
  EXPECT_NEAR(s.kl_p99, 0.99, 1e-12);
  EXPECT_EQ(s.n_tokens, 3);
}

TEST(EvalData, RowsAndOrder) {
  std::vector<int32_t> data(25);
  std::iota(data.begin(), data.end(), 0);
  auto rows = eval::cut_rows(data, 8, -1);
  ASSERT_EQ(rows.size(), 3u);  // the 1-token tail is dropped
  EXPECT_EQ(rows[2][0], 16);
  EXPECT_EQ(eval::cut_rows(data, 8, 2).size(), 2u);
  EXPECT_THROW(eval::cut_rows(data, 1, 2), Error);
  auto a = eval::shuffled_order(100, 7), b = eval::shuffled_order(100, 7), c = eval::shuffled_order(100, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<size_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(sorted[i], i);
}

TEST(EvalModel, SelfKlIsZeroAndBatchingDoesNotChangeLosses) {
  auto l = load(kStories);
  auto rows = some_rows(5, 40, l->cfg.vocab_size);
  eval::EvalOptions one, three;
  one.batch_size = 1;
  three.batch_size = 3;
  eval::TokenStats a = eval::evaluate(*l->m, rows, l->m.get(), one);
  eval::TokenStats b = eval::evaluate(*l->m, rows, nullptr, three);
  ASSERT_EQ(a.nll.size(), 5u * 39u);
  ASSERT_EQ(a.kl.size(), a.nll.size());
  EXPECT_TRUE(b.kl.empty());
  for (size_t i = 0; i < a.nll.size(); ++i) {
    EXPECT_EQ(a.kl[i], 0.0) << i;
    EXPECT_NEAR(a.nll[i], b.nll[i], 1e-4) << i;
    EXPECT_GT(a.nll[i], 0.0);
  }
  // Token 1 of row 0 from a one-token forward: -log softmax(logits)[row0[1]].
  auto kv = model::KvCache::allocate(*l->be, l->cfg, 1, 4);
  Tensor logits = test::run_chunk(*l->m, kv, rows[0], 0, 1, false);
  std::vector<double> lp;
  eval::log_softmax(logits.ptr<float>(), l->cfg.vocab_size, lp);
  EXPECT_NEAR(a.nll[0], -lp[rows[0][1]], 1e-4);
}

TEST(EvalModel, BadRowsFailByName) {
  auto l = load(kStories);
  auto rows = some_rows(2, 10, l->cfg.vocab_size);
  rows[1].push_back(3);
  EXPECT_THROW(eval::evaluate(*l->m, rows, nullptr), Error);  // ragged
  rows = some_rows(2, 10, l->cfg.vocab_size);
  rows[0][4] = l->cfg.vocab_size;
  EXPECT_THROW(eval::evaluate(*l->m, rows, nullptr), Error);  // id out of range
  rows = some_rows(1, l->cfg.max_position_embeddings + 2, l->cfg.vocab_size);
  EXPECT_THROW(eval::evaluate(*l->m, rows, nullptr), Error);  // past max positions
}

namespace {

// Rows of `len` tokens of Alice in Wonderland (../shared/fixtures/text, PROVENANCE.md) in dir's tokenizer.
std::vector<std::vector<int32_t>> text_rows(const std::string& dir, int n_rows, int len) {
  std::ifstream f(std::string(KILN_SHARED_DIR) + "/fixtures/text/alice_in_wonderland_gutenberg11.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str().substr(2000, 200000);  // past the Gutenberg header
  auto tok = tokenizer::Tokenizer::load_dir(dir);
  return eval::cut_rows(tok->encode(text, true), len, n_rows);
}

// The same weights twice: a float KV cache (the reference) and one quantized at bits.
eval::Summary kv_quant_kl(const std::string& dir, int bits, const std::vector<std::vector<int32_t>>& rows) {
  auto ref = load(dir);
  Loaded q;
  q.cfg = model::ModelConfig::load_dir(dir);
  q.cfg.kv_quant = backend::resolve_kv_quant(bits, 64, q.cfg.head_dim);
  q.weights = io::WeightSet::open_dir(dir);
  q.be = backend::make_cpu_backend();
  q.m = model::create_model(q.cfg, q.weights, *q.be);
  return eval::summarize(eval::evaluate(*q.m, rows, ref->m.get()));
}

}  // namespace

// stories260K is the hard case: head_dim 8 (groups of 8), and its RoPE'd keys span 11-23 per group
// (|k| up to 32), so an 8-bit step is ~0.06 and the scores move by ~0.1: KL 0.0034 at 8 bits
// (above the 0.002 that llama.cpp reports for q8_0 K+V on large models), 0.6 at 4 bits (perplexity
// 131 -> 178). The bounds hold those measurements with margin; the float cache itself gives 0.
TEST(EvalModel, QuantizedKvCacheKlOnStories260K) {
  const auto rows = text_rows(kStories, 16, 256);
  ASSERT_EQ(rows.size(), 16u);
  const eval::Summary s8 = kv_quant_kl(kStories, 8, rows), s4 = kv_quant_kl(kStories, 4, rows);
  std::printf("stories260K KV 8-bit: KL mean %.6f p99 %.6f ppl %.3f; 4-bit: KL mean %.6f p99 %.6f ppl %.3f\n",
              s8.kl_mean, s8.kl_p99, s8.perplexity, s4.kl_mean, s4.kl_p99, s4.perplexity);
  EXPECT_GT(s8.kl_mean, 0.0);  // the quantized cache is really in use
  EXPECT_LT(s8.kl_mean, 0.005);
  EXPECT_LT(s4.kl_mean, 1.0);
  EXPECT_LT(s8.kl_mean * 20, s4.kl_mean);  // 16x coarser steps
}

// A `kiln synth` llama-100m (random bf16 weights, head_dim 64, groups of 64): 8-bit KL < 0.002
// (measured ~1e-5), 4-bit < 0.02 (measured ~0.004).
TEST(EvalModel, QuantizedKvCacheKlOnSynthModel) {
  char tmpl[] = "/tmp/kiln-kvq-synth-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/llama-100m";
  ASSERT_EQ(std::system((std::string(KILN_BIN) + " synth --shape llama-100m --out " + dir + " > /dev/null 2>&1").c_str()), 0);
  const auto rows = text_rows(dir, 2, 160);
  ASSERT_EQ(rows.size(), 2u);
  const eval::Summary s8 = kv_quant_kl(dir, 8, rows), s4 = kv_quant_kl(dir, 4, rows);
  std::printf("synth llama-100m KV 8-bit: KL mean %.6f p99 %.6f; 4-bit: KL mean %.6f p99 %.6f\n", s8.kl_mean,
              s8.kl_p99, s4.kl_mean, s4.kl_p99);
  EXPECT_GT(s8.kl_mean, 0.0);
  EXPECT_LT(s8.kl_mean, 0.002);
  EXPECT_LT(s4.kl_mean, 0.02);
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}
