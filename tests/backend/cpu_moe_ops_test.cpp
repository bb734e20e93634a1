// The MoE ops' defaults (Backend::moe_route, ::moe_experts), which the CPU backend inherits and the
// CUDA parity tests use as reference: routing must equal, bit for bit, the host routing moe_block
// has always done (softmax in double, top-k by probability with ties to the lower index, optional
// renormalisation), recomputed here independently; the experts must equal each token's weighted
// sum of its experts' gated MLPs (double math here). Fresh random inputs each run, with ties forced.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu_test_util.h"

namespace kiln::backend::cpu {
namespace {

using test::Rng;
using test::to_floats;
using test::Experts;
using test::random_experts;

// The routing of moe_block (before the op existed), from scratch: ids [n, k] and weights [n, k].
void reference_route(const std::vector<float>& logits, int64_t n, int64_t n_experts, int k, bool norm,
                     std::vector<int32_t>& ids, std::vector<float>& weights) {
  ids.assign(n * k, -1);
  weights.assign(n * k, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits.data() + t * n_experts;
    double mx = l[0];
    for (int64_t e = 1; e < n_experts; ++e) mx = std::max(mx, double(l[e]));
    std::vector<double> p(n_experts);
    double sum = 0;
    for (int64_t e = 0; e < n_experts; ++e) sum += p[e] = std::exp(double(l[e]) - mx);
    for (auto& v : p) v /= sum;
    std::vector<int> order(n_experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });  // ties: lower index
    double top = 0;
    for (int i = 0; i < k; ++i) top += p[order[i]];
    for (int i = 0; i < k; ++i) {
      ids[t * k + i] = order[i];
      weights[t * k + i] = static_cast<float>(norm ? p[order[i]] / top : p[order[i]]);
    }
  }
}

// Logits with many exact ties (a coarse grid) or continuous values.
Tensor random_logits(Rng& rng, DType t, int64_t n, int64_t n_experts, bool ties) {
  Tensor f = rng.tensor(DType::f32, {n, n_experts}, 4.0f);
  if (ties)
    for (int64_t i = 0; i < f.numel(); ++i) f.ptr<float>()[i] = std::round(f.ptr<float>()[i]);
  if (t == DType::f32) return f;
  Tensor r = Tensor::host(t, f.shape);
  for (int64_t i = 0; i < f.numel(); ++i) r.ptr<uint16_t>()[i] = f32_to_bf16(f.ptr<float>()[i]);
  return r;
}

class CpuMoe : public test::LevelTest {};

TEST_P(CpuMoe, RouteIsTheHostRouting) {
  Rng rng("CpuMoe.Route");
  auto be = backend();
  EXPECT_FALSE(be->moe_on_device({}, 1)) << "the CPU has no device path";
  for (int64_t n_experts : {8, 16, 60})
    for (int k : {1, 2, 4, 8})
      for (bool norm : {false, true})
        for (bool ties : {false, true})
          for (DType lt : {DType::f32, DType::bf16}) {
            const int64_t n = rng.uniform_int(1, 40);
            SCOPED_TRACE(fmt::format("E={} k={} norm={} ties={} logits={} n={}", n_experts, k, norm, ties,
                                     dtype_name(lt), n));
            Tensor logits = random_logits(rng, lt, n, n_experts, ties);
            Tensor ids = Tensor::host(DType::i32, {n, k}), w = Tensor::host(DType::f32, {n, k});
            test::fill_nan(w);
            be->moe_route(logits, k, norm, ids, w);
            std::vector<int32_t> want_ids;
            std::vector<float> want_w;
            reference_route(to_floats(logits), n, n_experts, k, norm, want_ids, want_w);
            ASSERT_EQ(std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + n * k), want_ids);
            ASSERT_EQ(to_floats(w), want_w);
            for (int64_t t = 0; t < n; ++t) {  // the meaning: distinct experts, best first, sums
              std::vector<int32_t> row(ids.ptr<int32_t>() + t * k, ids.ptr<int32_t>() + (t + 1) * k);
              std::sort(row.begin(), row.end());
              EXPECT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "token " << t << ": repeated expert";
              double s = 0;
              for (int j = 0; j < k; ++j) {
                s += w.ptr<float>()[t * k + j];
                if (j > 0) {
                  EXPECT_GE(w.ptr<float>()[t * k + j - 1], w.ptr<float>()[t * k + j]);
                }
              }
              if (norm) {
                EXPECT_NEAR(s, 1.0, 1e-6);
              } else {
                EXPECT_LE(s, 1.0 + 1e-6);
              }
            }
          }
}

TEST_P(CpuMoe, RouteRejectsBadArguments) {
  auto be = backend();
  Tensor logits = Tensor::host(DType::f32, {3, 4});
  std::fill_n(logits.ptr<float>(), 12, 0.5f);
  Tensor ids = Tensor::host(DType::i32, {3, 2}), w = Tensor::host(DType::f32, {3, 2});
  EXPECT_THROW(be->moe_route(logits, 5, true, ids, w), Error);  // top_k > E
  EXPECT_THROW(be->moe_route(logits, 0, true, ids, w), Error);
  Tensor wrong = Tensor::host(DType::f32, {3, 2});
  EXPECT_THROW(be->moe_route(logits, 2, true, wrong, w), Error);  // ids not int32
  be->moe_route(logits, 2, true, ids, w);  // all equal: experts 0 and 1, half each
  EXPECT_EQ(ids.ptr<int32_t>()[0], 0);
  EXPECT_EQ(ids.ptr<int32_t>()[1], 1);
  EXPECT_EQ(w.ptr<float>()[0], 0.5f);
}


double act_ref(double g, Activation a) {
  if (a == Activation::silu) return g / (1.0 + std::exp(-g));
  if (a == Activation::gelu_tanh) return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
  return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
}

TEST_P(CpuMoe, ExpertsAreTheWeightedSumOfGatedMlps) {
  Rng rng("CpuMoe.Experts");
  auto be = backend();
  struct Case {
    int64_t n_experts, k, dim, ffn, n;
    DType wt;
    Activation act;
  };
  const std::vector<Case> cases = {{8, 2, 64, 32, 1, DType::bf16, Activation::silu},
                                   {8, 2, 64, 32, 16, DType::f32, Activation::silu},
                                   {16, 4, 48, 40, 7, DType::bf16, Activation::gelu_tanh},
                                   {4, 4, 33, 17, 5, DType::f32, Activation::gelu}};  // every expert, odd sizes
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("E={} k={} dim={} ffn={} n={} w={}", c.n_experts, c.k, c.dim, c.ffn, c.n,
                             dtype_name(c.wt)));
    Experts ex = random_experts(rng, c.wt, c.n_experts, c.dim, c.ffn);
    Tensor x = rng.tensor(DType::f32, {c.n, c.dim});
    Tensor ids = Tensor::host(DType::i32, {c.n, c.k}), w = Tensor::host(DType::f32, {c.n, c.k});
    be->moe_route(random_logits(rng, DType::f32, c.n, c.n_experts, false), int(c.k), true, ids, w);
    Tensor out = Tensor::host(DType::f32, {c.n, c.dim});
    test::fill_nan(out);
    be->moe_experts(x, ex.refs(), c.act, ids, w, out);
    const std::vector<float> xf = to_floats(x);
    for (int64_t t = 0; t < c.n; ++t) {
      std::vector<double> want(c.dim, 0.0);
      for (int64_t j = 0; j < c.k; ++j) {
        const int32_t e = ids.ptr<int32_t>()[t * c.k + j];
        const std::vector<float> g = to_floats(ex.gate[e].w), u = to_floats(ex.up[e].w), d = to_floats(ex.down[e].w);
        std::vector<double> h(c.ffn);
        for (int64_t r = 0; r < c.ffn; ++r) {
          double gs = 0, us = 0;
          for (int64_t i = 0; i < c.dim; ++i) gs += double(g[r * c.dim + i]) * xf[t * c.dim + i],
                                               us += double(u[r * c.dim + i]) * xf[t * c.dim + i];
          h[r] = act_ref(gs, c.act) * us;
        }
        for (int64_t r = 0; r < c.dim; ++r) {
          double ys = 0;
          for (int64_t i = 0; i < c.ffn; ++i) ys += double(d[r * c.ffn + i]) * h[i];
          want[r] += w.ptr<float>()[t * c.k + j] * ys;
        }
      }
      for (int64_t r = 0; r < c.dim; ++r)
        ASSERT_NEAR(out.ptr<float>()[t * c.dim + r], want[r], 1e-5 * (1 + std::abs(want[r])))
            << "token " << t << " feature " << r;
    }
  }
}

TEST_P(CpuMoe, ExpertsRejectBadIds) {
  Rng rng("CpuMoe.BadIds");
  auto be = backend();
  Experts ex = random_experts(rng, DType::f32, 4, 16, 8);
  Tensor x = rng.tensor(DType::f32, {2, 16}), out = Tensor::host(DType::f32, {2, 16});
  Tensor w = Tensor::host(DType::f32, {2, 1});
  std::fill_n(w.ptr<float>(), 2, 1.0f);
  EXPECT_THROW(be->moe_experts(x, ex.refs(), Activation::silu, test::host_ints({0, 4}), w, out), Error);
  EXPECT_THROW(be->moe_experts(x, ex.refs(), Activation::silu, test::host_ints({0, -1}), w, out), Error);
  EXPECT_THROW(be->moe_experts(x, ex.refs(), Activation::silu, test::host_ints({0, 1, 2}), w, out), Error);
  be->moe_experts(x, ex.refs(), Activation::silu, test::host_ints({3, 3}), w, out);  // both tokens on expert 3
  for (float v : to_floats(out)) EXPECT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(Levels, CpuMoe, ::testing::ValuesIn(test::available_levels()), test::level_name);

}  // namespace
}  // namespace kiln::backend::cpu
