// The CPU backend's quantized kernels against the reference: for every SIMD level this machine has
// (KILN_SIMD=scalar|avx2|avx512|avx512vnni as levels), every bit width and group size, fresh random inputs and
// weights quantized by quant::quantize: matmul (decode GEMV sizes and prefill GEMM sizes) equals
// the f32 matmul with the dequantized weight, and the quantized embedding gathers dequantized rows.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../backend/cpu_test_util.h"
#include "kiln/quant/affine.h"

using namespace kiln;
using namespace kiln::backend;
using namespace kiln::backend::cpu;
using namespace kiln::backend::cpu::test;

namespace {

Weight as_weight(const quant::QuantizedMatrix& q) {
  Weight w;
  w.w = q.weight;
  w.scales = q.scales;
  w.biases = q.biases;
  w.bits = q.bits;
  w.group_size = q.group_size;
  return w;
}

// y_ref [n, out] = x · dequant(w)ᵀ in double.
std::vector<double> reference(const Tensor& x, const Tensor& wd) {
  const int64_t n = x.dim(0), in = x.dim(1), out = wd.dim(0);
  std::vector<double> y(n * out);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k)
        s += static_cast<double>(x.ptr<float>()[t * in + k]) * wd.ptr<float>()[o * in + k];
      y[t * out + o] = s;
    }
  return y;
}

class QuantOps : public LevelTest {};

}  // namespace

TEST_P(QuantOps, MatmulMatchesDequantizedMatmul) {
  auto be = backend();
  Rng rng("QuantOps.Matmul");
  const int bits_list[] = {2, 3, 4, 5, 6, 8};
  const int groups[] = {32, 64, 128};
  for (int bits : bits_list)
    for (int gs : groups)
      // n: one decode token, small decode batches (passes of up to 4 tokens: 2, 3, 4 + 1, 4 + 3),
      // and prefill sizes (GEMM path, kGemmMinTokens = 12). out 37: not a multiple of any tile; in
      // spans 2+ k-blocks.
      for (int64_t n : {1, 2, 3, 5, 7, 13}) {
        const int64_t out = 37, in = gs == 128 ? 640 : 2 * 256 + 2 * gs;
        const DType sdt = bits % 2 ? DType::bf16 : DType::f32;  // scales in bf16 or f32
        Tensor wf = rng.tensor(DType::f32, {out, in}, 0.1f);
        quant::QuantizedMatrix q = quant::quantize(wf, bits, gs, sdt);
        Tensor wd = quant::dequantize(q, DType::f32);
        Tensor x = rng.tensor(DType::f32, {n, in});
        Tensor y = be->alloc(DType::f32, {n, out});
        fill_nan(y);
        be->matmul(x, as_weight(q), y);
        const std::vector<double> ref = reference(x, wd);
        for (int64_t i = 0; i < n * out; ++i) {
          // f32 accumulation over `in` terms of |x| <= 1, |w| <= 0.1: a few ulps of sum |x w|.
          const double tol = 1e-5 * in * 0.1 + 1e-5;
          ASSERT_NEAR(y.ptr<float>()[i], ref[i], tol) << bits << " bits, group " << gs << ", n " << n << ", at " << i;
        }
      }
}

TEST_P(QuantOps, MatmulAddsBiasAndReadsRowSlices) {
  auto be = backend();
  Rng rng("QuantOps.Bias");
  const int64_t out = 24, in = 128;
  Tensor wf = rng.tensor(DType::f32, {out, in}, 0.2f);
  quant::QuantizedMatrix q = quant::quantize(wf, 4, 64, DType::bf16);
  Tensor wd = quant::dequantize(q, DType::f32);
  Weight w = as_weight(q);
  w.bias = rng.tensor(DType::bf16, {out});
  // Rows [8, 20) as a view (how fused qkv projections are split at load).
  Weight v;
  v.w = w.w.slice_rows(8, 20);
  v.scales = w.scales.slice_rows(8, 20);
  v.biases = w.biases.slice_rows(8, 20);
  v.bits = 4;
  v.group_size = 64;
  for (int64_t n : {1, 16}) {
    Tensor x = rng.tensor(DType::f32, {n, in});
    Tensor y = be->alloc(DType::f32, {n, out}), yv = be->alloc(DType::f32, {n, 12});
    be->matmul(x, w, y);
    be->matmul(x, v, yv);
    const std::vector<double> ref = reference(x, wd);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < out; ++o) {
        const double b = bf16_to_f32(w.bias.ptr<uint16_t>()[o]);
        ASSERT_NEAR(y.ptr<float>()[t * out + o], ref[t * out + o] + b, 1e-4) << "n " << n << " o " << o;
        if (o >= 8 && o < 20) {
          ASSERT_NEAR(yv.ptr<float>()[t * 12 + o - 8], ref[t * out + o], 1e-4);
        }
      }
  }
}

TEST_P(QuantOps, EmbeddingGathersDequantizedRows) {
  auto be = backend();
  Rng rng("QuantOps.Embedding");
  for (int bits : {3, 4, 6, 8}) {
    const int64_t vocab = 50, dim = 96;
    Tensor tf = rng.tensor(DType::f32, {vocab, dim});
    quant::QuantizedMatrix q = quant::quantize(tf, bits, 32, DType::f16);
    Tensor td = quant::dequantize(q, DType::f32);
    Tensor ids = Tensor::host(DType::i32, {4});
    const int32_t pick[4] = {0, 49, 7, 7};
    for (int i = 0; i < 4; ++i) ids.ptr<int32_t>()[i] = pick[i];
    Tensor out = be->alloc(DType::f32, {4, dim});
    be->embedding(as_weight(q), ids, out);
    for (int i = 0; i < 4; ++i)
      for (int64_t k = 0; k < dim; ++k)
        ASSERT_NEAR(out.ptr<float>()[i * dim + k], td.ptr<float>()[pick[i] * dim + k], 1e-6) << bits << " bits";
    ids.ptr<int32_t>()[1] = 50;
    EXPECT_THROW(be->embedding(as_weight(q), ids, out), Error);
  }
}

TEST_P(QuantOps, RejectsMismatchedScales) {
  auto be = backend();
  Rng rng("QuantOps.Reject");
  quant::QuantizedMatrix q = quant::quantize(rng.tensor(DType::f32, {8, 64}), 4, 32, DType::f32);
  Weight w = as_weight(q);
  w.group_size = 64;  // scales hold 2 groups per row, not 1
  Tensor x = rng.tensor(DType::f32, {1, 64}), y = be->alloc(DType::f32, {1, 8});
  EXPECT_THROW(be->matmul(x, w, y), Error);
  Weight w2 = as_weight(q);
  Tensor x2 = rng.tensor(DType::f32, {1, 32});
  EXPECT_THROW(be->matmul(x2, w2, y), Error);  // x has 32 features, the weight 64
}

INSTANTIATE_TEST_SUITE_P(Levels, QuantOps, ::testing::ValuesIn(available_levels()), level_name);
