// eval::: the math (log-softmax, KL, numpy's quantile, mlx_lm.perplexity's mean/SE), the data cut
// into rows, and evaluate() on the real stories260K: KL of a model against itself is 0, batching
// rows does not change the losses, the per-token loss equals -log softmax of a direct forward, and
// bad rows fail by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "../model_test_util.h"
#include "kiln/eval/perplexity.h"

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
