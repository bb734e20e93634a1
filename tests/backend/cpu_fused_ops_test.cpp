// The fused ops' defaults (Backend::add_rms_norm, ::rope_kv_write, ::matmul_multi), which the CPU
// backend inherits and the CUDA parity tests use as reference: each must equal, bit for bit, the
// separate ops it stands for, on fresh random inputs (odd sizes, padding slots, partial rotary),
// and reject mismatched arguments by name. The separate ops have their own tests (cpu_ops_test).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "cpu_test_util.h"

namespace kiln::backend::cpu {
namespace {

using test::Rng;
using test::to_floats;

Tensor clone(const Tensor& t) {
  Tensor r = Tensor::host(t.dtype, t.shape);
  std::memcpy(r.data, t.data, t.nbytes());
  return r;
}

class CpuFused : public test::LevelTest {};

TEST_P(CpuFused, AddRmsNormEqualsAddThenNorm) {
  Rng rng("CpuFused.AddRmsNorm");
  auto be = backend();
  for (DType wt : {DType::f32, DType::bf16})
    for (bool one_plus : {false, true})
      for (auto [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {5, 77}, {3, 1000}, {17, 16}}) {
        SCOPED_TRACE(fmt::format("w={} one_plus={} rows={} dim={}", dtype_name(wt), one_plus, rows, dim));
        Tensor w = rng.tensor(wt, {dim});
        Tensor x0 = rng.tensor(DType::f32, {rows, dim}, 3.0f), delta = rng.tensor(DType::f32, {rows, dim}, 2.0f);
        Tensor x = clone(x0), y = Tensor::host(DType::f32, {rows, dim});
        test::fill_nan(y);
        be->add_rms_norm(x, delta, w, 1e-5f, one_plus, y);
        Tensor xs = clone(x0), ys = Tensor::host(DType::f32, {rows, dim});
        be->add(xs, delta, xs);
        be->rms_norm(xs, w, 1e-5f, one_plus, ys);
        EXPECT_EQ(to_floats(x), to_floats(xs));
        EXPECT_EQ(to_floats(y), to_floats(ys));
        // The meaning, independently: x holds x0 + delta; each y row is x / rms(x) * w (double math).
        const std::vector<float> wf = to_floats(w);
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (int64_t d = 0; d < dim; ++d) {
            const int64_t i = r * dim + d;
            ASSERT_EQ(x.ptr<float>()[i], x0.ptr<float>()[i] + delta.ptr<float>()[i]);
            ss += double(x.ptr<float>()[i]) * x.ptr<float>()[i];
          }
          const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
          for (int64_t d = 0; d < dim; ++d) {
            const double want = x.ptr<float>()[r * dim + d] * inv * (one_plus ? 1.0 + wf[d] : wf[d]);
            ASSERT_NEAR(y.ptr<float>()[r * dim + d], want, 1e-5 * (1 + std::abs(want))) << "row " << r << " dim " << d;
          }
        }
        // y may alias delta (the model reuses the block output): the same values.
        Tensor xa = clone(x0), da = clone(delta);
        be->add_rms_norm(xa, da, w, 1e-5f, one_plus, da);
        EXPECT_EQ(to_floats(xa), to_floats(xs));
        EXPECT_EQ(to_floats(da), to_floats(ys));
      }
  Tensor x = Tensor::host(DType::f32, {2, 8}), d = Tensor::host(DType::f32, {2, 7}), w = Tensor::host(DType::f32, {8});
  Tensor y = Tensor::host(DType::f32, {2, 8});
  EXPECT_THROW(be->add_rms_norm(x, d, w, 1e-5f, false, y), Error);
}

TEST_P(CpuFused, RopeKvWriteEqualsRopeThenKvWrite) {
  Rng rng("CpuFused.RopeKvWrite");
  auto be = backend();
  struct Case {
    int64_t n, heads, kv_heads, hd, half;
  };
  for (const Case& c : std::vector<Case>{{1, 8, 2, 64, 32}, {7, 4, 4, 128, 64}, {9, 6, 2, 80, 16}}) {
    SCOPED_TRACE(fmt::format("n={} heads={} kv_heads={} hd={} half={}", c.n, c.heads, c.kv_heads, c.hd, c.half));
    const int64_t width = c.kv_heads * c.hd, n_slots = c.n + 5;
    Tensor inv = Tensor::host(DType::f32, {c.half});
    for (int64_t i = 0; i < c.half; ++i) inv.ptr<float>()[i] = std::pow(10000.0f, -float(2 * i) / float(2 * c.half));
    std::vector<int32_t> pos(c.n), slot(c.n), perm(n_slots);
    for (auto& p : pos) p = static_cast<int32_t>(rng.uniform_int(1, 4000));  // > 0: every pair turns
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.gen());
    for (int64_t t = 0; t < c.n; ++t) slot[t] = t % 4 == 1 ? -1 : perm[t];  // -1: padding
    Tensor q0 = rng.tensor(DType::f32, {c.n, c.heads, c.hd}), k0 = rng.tensor(DType::f32, {c.n, c.kv_heads, c.hd});
    Tensor v = rng.tensor(DType::f32, {c.n, width});
    Tensor kc0 = rng.tensor(DType::f32, {n_slots, width}), vc0 = rng.tensor(DType::f32, {n_slots, width});

    Tensor q = clone(q0), k = clone(k0), kc = clone(kc0), vc = clone(vc0);
    be->rope_kv_write(q, k, v, test::host_ints(pos), inv, 1.0f, test::host_ints(slot), kc, vc);
    Tensor qs = clone(q0), ks = clone(k0), kcs = clone(kc0), vcs = clone(vc0);
    be->rope(qs, test::host_ints(pos), inv, 1.0f);
    be->rope(ks, test::host_ints(pos), inv, 1.0f);
    be->kv_write(ks.view({c.n, width}), v, test::host_ints(slot), kcs, vcs);
    EXPECT_EQ(to_floats(q), to_floats(qs));
    EXPECT_EQ(to_floats(k), to_floats(ks));
    EXPECT_EQ(to_floats(kc), to_floats(kcs));
    EXPECT_EQ(to_floats(vc), to_floats(vcs));
    // The meaning: q/k rotated (changed) over the rotary dims only; the cache rows of valid slots
    // hold the rotated k and v, every other row is untouched.
    EXPECT_NE(to_floats(q), to_floats(q0));
    for (int64_t t = 0; t < c.n; ++t)
      for (int64_t h = 0; h < c.kv_heads; ++h)
        for (int64_t d = 2 * c.half; d < c.hd; ++d) {
          const int64_t i = (t * c.kv_heads + h) * c.hd + d;
          ASSERT_EQ(k.ptr<float>()[i], k0.ptr<float>()[i]) << "a dim past the rotary part changed";
        }
    std::vector<bool> written(n_slots, false);
    for (int64_t t = 0; t < c.n; ++t) {
      if (slot[t] < 0) continue;
      written[slot[t]] = true;
      EXPECT_EQ(0, std::memcmp(kc.ptr<float>() + slot[t] * width, k.ptr<float>() + t * width, width * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(vc.ptr<float>() + slot[t] * width, v.ptr<float>() + t * width, width * sizeof(float)));
    }
    for (int64_t s = 0; s < n_slots; ++s) {
      if (written[s]) continue;
      EXPECT_EQ(0, std::memcmp(kc.ptr<float>() + s * width, kc0.ptr<float>() + s * width, width * sizeof(float)))
          << "slot " << s << " was not to be written";
    }
  }
  Tensor q = Tensor::host(DType::f32, {2, 8}), k = Tensor::host(DType::f32, {2, 2, 4});  // q not 3-D
  Tensor v = Tensor::host(DType::f32, {2, 8}), kc = Tensor::host(DType::f32, {4, 8}), vc = Tensor::host(DType::f32, {4, 8});
  Tensor inv = Tensor::host(DType::f32, {2});
  EXPECT_THROW(be->rope_kv_write(q, k, v, test::host_ints({0, 1}), inv, 1.0f, test::host_ints({0, 1}), kc, vc), Error);
}

TEST_P(CpuFused, MatmulMultiEqualsMatmuls) {
  Rng rng("CpuFused.MatmulMulti");
  auto be = backend();
  // q/k/v-like (3 matrices of different out, biases on some), gate/up-like, 4 matrices; 1 and 5 tokens.
  const std::vector<std::vector<int64_t>> shapes = {{96, 32, 32}, {200, 200}, {5, 77, 13, 1}};
  for (int64_t n : {1, 5})
    for (DType wt : {DType::f32, DType::bf16})
      for (const auto& outs : shapes) {
        SCOPED_TRACE(fmt::format("n={} w={} matrices={}", n, dtype_name(wt), outs.size()));
        const int64_t in = 67;
        const size_t m = outs.size();
        std::vector<Weight> w(m);
        std::vector<Tensor> y(m);
        std::vector<const Weight*> wp(m);
        std::vector<Tensor*> yp(m);
        for (size_t i = 0; i < m; ++i) {
          w[i].w = rng.tensor(wt, {outs[i], in});
          if (i % 2 == 0) w[i].bias = rng.tensor(wt, {outs[i]});
          y[i] = Tensor::host(DType::f32, {n, outs[i]});
          test::fill_nan(y[i]);
          wp[i] = &w[i], yp[i] = &y[i];
        }
        Tensor x = rng.tensor(DType::f32, {n, in});
        be->matmul_multi(x, wp, yp);
        for (size_t i = 0; i < m; ++i) {
          Tensor single = Tensor::host(DType::f32, {n, outs[i]});
          be->matmul(x, w[i], single);
          EXPECT_EQ(to_floats(y[i]), to_floats(single)) << "matrix " << i;
        }
      }
  // Mismatched counts and more than kMaxMultiMatmul pairs fail by name.
  Weight w1;
  w1.w = rng.tensor(DType::f32, {4, 8});
  Tensor x = rng.tensor(DType::f32, {1, 8}), y1 = Tensor::host(DType::f32, {1, 4});
  std::vector<const Weight*> two = {&w1, &w1};
  std::vector<Tensor*> one = {&y1};
  EXPECT_THROW(be->matmul_multi(x, two, one), Error);
  std::vector<const Weight*> five(5, &w1);
  std::vector<Tensor*> five_y(5, &y1);
  EXPECT_THROW(be->matmul_multi(x, five, five_y), Error);
}

INSTANTIATE_TEST_SUITE_P(Levels, CpuFused, ::testing::ValuesIn(test::available_levels()), test::level_name);

}  // namespace
}  // namespace kiln::backend::cpu
