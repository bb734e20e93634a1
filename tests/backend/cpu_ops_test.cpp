// CPU backend ops against naive references written plainly here (double accumulation), on fresh
// random inputs (the seed is printed; KILN_TEST_SEED=<n> replays one), with odd sizes, f32/bf16/f16
// weights, at every SIMD level this machine supports. Attention has its own file
// (cpu_attention_test.cpp). Tolerances are stated per test, relative to the values' magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cpu_test_util.h"

namespace kiln::backend::cpu {
namespace {

using test::Rng;

class CpuOps : public test::LevelTest {};

// ---- matmul

// y[t][o] = sum_k x[t][k] * w[o][k] (+ b[o]) in double; also the magnitude sum_k |x w| per output.
void ref_matmul(const std::vector<float>& x, const Tensor& w, const Tensor* bias, int64_t n, int64_t in, int64_t out,
                std::vector<double>& y, std::vector<double>& mag) {
  std::vector<float> wf = test::to_floats(w);
  std::vector<float> bf = bias ? test::to_floats(*bias) : std::vector<float>();
  y.assign(n * out, 0.0);
  mag.assign(n * out, 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < in; ++k) {
        double p = double(x[t * in + k]) * double(wf[o * in + k]);
        s += p;
        m += std::fabs(p);
      }
      if (bias) {
        s += bf[o];
        m += std::fabs(bf[o]);
      }
      y[t * out + o] = s;
      mag[t * out + o] = m;
    }
}

TEST_P(CpuOps, MatmulMatchesReference) {
  Rng rng("CpuOps.Matmul");
  auto be = backend();
  struct Case { int64_t n, in, out; };
  // n < 16 takes the GEMV path, n >= 16 the blocked GEMM; in > 256 spans several k-blocks, out > 128
  // several tiles, n > 240 several token blocks; odd sizes leave partial panels and register tiles.
  const Case cases[] = {{1, 67, 131}, {3, 67, 131}, {5, 1, 7}, {15, 130, 33}, {16, 67, 131},
                        {17, 300, 257}, {40, 513, 70}, {7, 1000, 300}, {33, 129, 129}, {250, 70, 45}};
  for (DType wt : {DType::f32, DType::bf16, DType::f16})
    for (const Case& c : cases)
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(fmt::format("{} n={} in={} out={} bias={}", dtype_name(wt), c.n, c.in, c.out, with_bias));
        Tensor x = rng.tensor(DType::f32, {c.n, c.in});
        Weight w;
        w.w = rng.tensor(wt, {c.out, c.in});
        if (with_bias) w.bias = rng.tensor(wt, {c.out});
        Tensor y = be->alloc(DType::f32, {c.n, c.out});
        test::fill_nan(y);  // every output must be written
        be->matmul(x, w, y);
        std::vector<double> ref, mag;
        ref_matmul(test::to_floats(x), w.w, with_bias ? &w.bias : nullptr, c.n, c.in, c.out, ref, mag);
        // f32 accumulation of `in` products: error well under 1e-5 of sum |x_k w_k|.
        for (int64_t i = 0; i < c.n * c.out; ++i)
          ASSERT_NEAR(y.ptr<float>()[i], ref[i], 1e-5 * mag[i] + 1e-6) << "at " << i;
      }
}

// A quantized Weight missing its scales/biases is rejected by name (tests/quant/ covers real ones).
TEST_P(CpuOps, MatmulRejectsMalformedQuantizedAndBadShapes) {
  auto be = backend();
  Rng rng("CpuOps.MatmulRejects");
  Weight q;
  q.w = Tensor::host(DType::u32, {8, 8});
  q.bits = 4;
  q.group_size = 32;
  Tensor x = rng.tensor(DType::f32, {2, 64}), y = be->alloc(DType::f32, {2, 8});
  try {
    be->matmul(x, q, y);
    FAIL() << "quantized matmul without scales did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scales"), std::string::npos) << e.what();
  }
  EXPECT_THROW(be->embedding(q, Tensor::host(DType::i32, {1}), y), Error);
  Weight w;
  w.w = rng.tensor(DType::bf16, {8, 63});
  EXPECT_THROW(be->matmul(x, w, y), Error);  // in mismatch
}

// ---- embedding

TEST_P(CpuOps, EmbeddingGathersRowsExactly) {
  auto be = backend();
  Rng rng("CpuOps.Embedding");
  for (DType wt : {DType::f32, DType::bf16, DType::f16}) {
    const int64_t vocab = 97, dim = 67, n = 13;
    Weight table;
    table.w = rng.tensor(wt, {vocab, dim});
    Tensor ids = Tensor::host(DType::i32, {n});
    for (int64_t t = 0; t < n; ++t) ids.ptr<int32_t>()[t] = static_cast<int32_t>(rng.uniform_int(0, vocab - 1));
    ids.ptr<int32_t>()[0] = vocab - 1;
    Tensor out = be->alloc(DType::f32, {n, dim});
    be->embedding(table, ids, out);
    std::vector<float> tf = test::to_floats(table.w);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < dim; ++d)  // conversion to f32 is exact
        ASSERT_EQ(out.ptr<float>()[t * dim + d], tf[ids.ptr<int32_t>()[t] * dim + d]) << dtype_name(wt);
    ids.ptr<int32_t>()[3] = static_cast<int32_t>(vocab);
    EXPECT_THROW(be->embedding(table, ids, out), Error);
  }
}

// ---- rms_norm

TEST_P(CpuOps, RmsNormMatchesReference) {
  auto be = backend();
  Rng rng("CpuOps.RmsNorm");
  for (DType wt : {DType::f32, DType::bf16, DType::f16})
    for (int64_t dim : {1, 8, 67, 128, 1000})
      for (bool one_plus : {false, true})
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(fmt::format("{} dim={} one_plus={} in_place={}", dtype_name(wt), dim, one_plus, in_place));
          const int64_t rows = 37;
          const float eps = 1e-5f;
          Tensor x = rng.tensor(DType::f32, {rows, dim}, 3.0f);
          Tensor w = rng.tensor(wt, {dim});
          std::vector<float> xs = test::to_floats(x), ws = test::to_floats(w);
          Tensor y = in_place ? x : be->alloc(DType::f32, {rows, dim});
          be->rms_norm(x, w, eps, one_plus, y);
          for (int64_t r = 0; r < rows; ++r) {
            double ss = 0;
            for (int64_t d = 0; d < dim; ++d) ss += double(xs[r * dim + d]) * xs[r * dim + d];
            double inv = 1.0 / std::sqrt(ss / dim + eps);
            for (int64_t d = 0; d < dim; ++d) {
              double g = one_plus ? 1.0 + ws[d] : ws[d];
              double ref = xs[r * dim + d] * inv * g;
              // a handful of f32 roundings: 1e-5 relative to |x|/rms * |g|
              ASSERT_NEAR(y.ptr<float>()[r * dim + d], ref, 1e-5 * (std::fabs(xs[r * dim + d]) * inv * std::fabs(g)) + 1e-7);
            }
          }
        }
}

// ---- rope

TEST_P(CpuOps, RopeRotatesHalvesByPosition) {
  auto be = backend();
  Rng rng("CpuOps.Rope");
  for (int64_t head_dim : {8, 16, 64, 128})
    for (bool partial : {false, true}) {
      SCOPED_TRACE(fmt::format("head_dim={} partial={}", head_dim, partial));
      const int64_t n = 9, n_heads = 3, half = partial ? head_dim / 4 : head_dim / 2;
      const float attn_factor = partial ? 1.25f : 1.0f;
      Tensor x = rng.tensor(DType::f32, {n, n_heads, head_dim});
      std::vector<float> x0 = test::to_floats(x);
      Tensor pos = Tensor::host(DType::i32, {n});
      for (int64_t t = 0; t < n; ++t) pos.ptr<int32_t>()[t] = static_cast<int32_t>(rng.uniform_int(0, 8191));
      pos.ptr<int32_t>()[0] = 0;
      Tensor inv_freq = Tensor::host(DType::f32, {half});
      for (int64_t i = 0; i < half; ++i)
        inv_freq.ptr<float>()[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / (2.0 * half)));
      be->rope(x, pos, inv_freq, attn_factor);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < n_heads; ++h) {
          const float* a = x0.data() + (t * n_heads + h) * head_dim;
          const float* r = x.ptr<float>() + (t * n_heads + h) * head_dim;
          for (int64_t i = 0; i < head_dim; ++i) {
            double ref;
            if (i < 2 * half) {
              int64_t j = i % half;
              // the angle is an f32 product, as in HF (position f32 times inv_freq f32)
              float ang = static_cast<float>(pos.ptr<int32_t>()[t]) * inv_freq.ptr<float>()[j];
              double c = std::cos(double(ang)) * attn_factor, s = std::sin(double(ang)) * attn_factor;
              ref = i < half ? a[i] * c - a[i + half] * s : a[i] * c + a[i - half] * s;
            } else {
              ref = a[i];  // beyond the rotary dims: untouched
            }
            ASSERT_NEAR(r[i], ref, 2e-6 * (std::fabs(a[i]) + std::fabs(a[(i + half) % head_dim]) + 1.0)) << i;
          }
        }
    }
}

// ---- gated activations

TEST_P(CpuOps, GatedActivationsMatchFormulas) {
  auto be = backend();
  Rng rng("CpuOps.GatedAct");
  const double c = std::sqrt(2.0 / M_PI);
  for (Activation act : {Activation::silu, Activation::gelu_tanh, Activation::gelu})
    for (bool alias : {false, true}) {
      const int64_t rows = 5, ffn = 20011;  // > one parallel chunk, odd tail
      Tensor g = rng.tensor(DType::f32, {rows, ffn}, 6.0f), u = rng.tensor(DType::f32, {rows, ffn});
      std::vector<float> gs = test::to_floats(g), us = test::to_floats(u);
      Tensor out = alias ? g : be->alloc(DType::f32, {rows, ffn});
      be->gated_act(g, u, act, out);
      for (int64_t i = 0; i < rows * ffn; ++i) {
        double x = gs[i], a;
        switch (act) {
          case Activation::silu: a = x / (1.0 + std::exp(-x)); break;
          case Activation::gelu_tanh: a = 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x))); break;
          default: a = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); break;
        }
        double ref = a * us[i];
        ASSERT_NEAR(out.ptr<float>()[i], ref, 2e-6 * (std::fabs(x) + 1.0) * std::fabs(us[i]) + 1e-7)
            << "act " << int(act) << " x=" << x;
      }
    }
}

// ---- elementwise and buffers

TEST_P(CpuOps, ElementwiseAndBuffers) {
  auto be = backend();
  Rng rng("CpuOps.Elementwise");
  const int64_t n = 100003;
  Tensor a = rng.tensor(DType::f32, {n}, 20.0f), b = rng.tensor(DType::f32, {n});
  std::vector<float> as = test::to_floats(a), bs = test::to_floats(b);
  Tensor y = be->alloc(DType::f32, {n});
  be->add(a, b, y);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y.ptr<float>()[i], as[i] + bs[i]);
  be->add(y, b, y);  // aliasing output
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y.ptr<float>()[i], (as[i] + bs[i]) + bs[i]);
  be->scale(a, -0.375f);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a.ptr<float>()[i], as[i] * -0.375f);
  be->copy(b, a);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a.ptr<float>()[i], bs[i]);
  Tensor s = rng.tensor(DType::f32, {n}, 100.0f);
  std::vector<float> ss = test::to_floats(s);
  be->softcap(s, 30.0f);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(s.ptr<float>()[i], 30.0 * std::tanh(ss[i] / 30.0), 1e-5);
  be->fill_zero(s);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(s.ptr<float>()[i], 0.0f);

  Tensor x = rng.tensor(DType::f32, {11, 67});
  Tensor rows = Tensor::host(DType::i32, {4});
  const int32_t r[4] = {10, 0, 10, 5};
  std::memcpy(rows.data, r, sizeof r);
  Tensor g = be->alloc(DType::f32, {4, 67});
  be->gather_rows(x, rows, g);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(0, std::memcmp(g.ptr<float>() + i * 67, x.ptr<float>() + r[i] * 67, 67 * 4));
  rows.ptr<int32_t>()[1] = 11;
  EXPECT_THROW(be->gather_rows(x, rows, g), Error);
  // scatter_rows, gather_rows' inverse: rows 10, 0, 5 of y take g's rows 0, 1, 3; the rest stay.
  Tensor sy = rng.tensor(DType::f32, {11, 67}), sy0 = rng.tensor(DType::f32, {11, 67});
  std::memcpy(sy0.data, sy.data, sy.nbytes());
  const int32_t to[3] = {10, 0, 5};
  Tensor to_rows = Tensor::host(DType::i32, {3});
  std::memcpy(to_rows.data, to, sizeof to);
  Tensor src = Tensor::host(DType::f32, {3, 67});
  for (int i = 0; i < 3; ++i) std::memcpy(src.ptr<float>() + i * 67, g.ptr<float>() + (i == 2 ? 3 : i) * 67, 67 * 4);
  be->scatter_rows(src, to_rows, sy);
  for (int r_ = 0; r_ < 11; ++r_) {
    const int i = r_ == 10 ? 0 : r_ == 0 ? 1 : r_ == 5 ? 2 : -1;
    const float* want = i >= 0 ? src.ptr<float>() + i * 67 : sy0.ptr<float>() + r_ * 67;
    EXPECT_EQ(0, std::memcmp(sy.ptr<float>() + r_ * 67, want, 67 * 4)) << "row " << r_;
  }
  to_rows.ptr<int32_t>()[2] = 11;
  EXPECT_THROW(be->scatter_rows(src, to_rows, sy), Error);

  Tensor h = Tensor::host(DType::f32, {3});
  EXPECT_EQ(be->upload(h).data, h.data);  // CPU buffers alias
  EXPECT_EQ(be->to_host(h).data, h.data);
  EXPECT_EQ(be->act_dtype(), DType::f32);
  EXPECT_EQ(be->device(), Device::cpu);
}

// ---- MoE combine and greedy argmax (moe_ops.cpp, backend_defaults.cpp through the CPU buffers)

TEST_P(CpuOps, ScatterAddRowsAndArgmax) {
  auto be = backend();
  Rng rng("CpuOps.ScatterArgmax");
  const int64_t n = 7, m = 19, d = 67;
  Tensor src = rng.tensor(DType::f32, {m, d}), dst = rng.tensor(DType::f32, {n, d});
  Tensor rows = Tensor::host(DType::i32, {m}), w = rng.tensor(DType::f32, {m});
  for (int64_t i = 0; i < m; ++i) rows.ptr<int32_t>()[i] = static_cast<int32_t>(rng.uniform_int(0, n - 1));
  rows.ptr<int32_t>()[1] = rows.ptr<int32_t>()[0];  // a repeated row accumulates twice
  std::vector<double> ref(n * d);
  for (int64_t i = 0; i < n * d; ++i) ref[i] = dst.ptr<float>()[i];
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < d; ++j)
      ref[rows.ptr<int32_t>()[i] * d + j] += double(w.ptr<float>()[i]) * src.ptr<float>()[i * d + j];
  be->scatter_add_rows(src, rows, w, dst);
  for (int64_t i = 0; i < n * d; ++i) ASSERT_NEAR(dst.ptr<float>()[i], ref[i], 1e-5) << i;

  Tensor ids = be->alloc(DType::i32, {n});
  be->argmax_rows(dst, ids);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = dst.ptr<float>() + r * d;
    EXPECT_EQ(ids.ptr<int32_t>()[r], std::max_element(row, row + d) - row) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, CpuOps, ::testing::ValuesIn(test::available_levels()), test::level_name);

// ---- level selection

TEST(CpuSimd, EnvForcesLevelAndRejectsUnknown) {
  ASSERT_EQ(0, setenv("KILN_SIMD", "scalar", 1));
  auto be = make_cpu_backend();
  auto* cpu = dynamic_cast<CpuBackend*>(be.get());
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->simd_level(), SimdLevel::scalar);
  ASSERT_EQ(0, setenv("KILN_SIMD", "sse9", 1));
  EXPECT_THROW(make_cpu_backend(), Error);
  ASSERT_EQ(0, unsetenv("KILN_SIMD"));
  be = make_cpu_backend();
  EXPECT_EQ(dynamic_cast<CpuBackend*>(be.get())->simd_level(), best_simd_level());
  std::printf("best SIMD level here: %s\n", simd_level_name(best_simd_level()));
}

}  // namespace
}  // namespace kiln::backend::cpu
