// The CPU backend's inner kernels as a table of function pointers, one table per SIMD level
// (scalar, AVX2+FMA+F16C, AVX-512, AVX-512 with VNNI: the AVX-512 table with integer quantized GEMVs).
// Each level lives in its own translation unit compiled with its own -m flags; the backend picks a
// table once at creation (__builtin_cpu_supports, KILN_SIMD).
#pragma once
#include <cstdint>
#include <type_traits>

#include "kiln/tensor/tensor.h"

namespace kiln::backend::cpu {

enum class SimdLevel { scalar = 0, avx2 = 1, avx512 = 2, avx512vnni = 3 };
const char* simd_level_name(SimdLevel l);

// A packed affine-quantized matrix in MLX's layout (docs/quantization.md): row r's `in` codes are
// the LSB-first bit stream at w + r * row_bytes (row_bytes = in * bits / 8); value = scale * q + bias
// with scales/biases [out, in / group_size] of dtype sdt (f32/bf16/f16). `end` is one past the last
// byte of w: kernels never load past it (they copy the tail into a padded buffer instead).
struct QMatrix {
  const uint8_t* w = nullptr;
  const uint8_t* end = nullptr;
  int64_t row_bytes = 0;
  const void* scales = nullptr;
  const void* biases = nullptr;
  DType sdt = DType::f32;
  int bits = 0, group_size = 0;
  int64_t in = 0, out = 0;
  int64_t n_groups() const { return in / group_size; }
};

struct Kernels {
  SimdLevel level = SimdLevel::scalar;
  // GEMM microkernel tile: gemm_mr tokens x gemm_nr output features; gemm_nr is also the width of
  // one packed weight panel.
  int gemm_mr = 1, gemm_nr = 1;

  // dst[i] = float(src[i]), i < n; src is f32, bf16 or f16.
  void (*to_f32)(const void* src, DType t, float* dst, int64_t n);
  // a·b over n floats.
  float (*dot)(const float* a, const float* b, int64_t n);
  // y += a * x over n floats.
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  // y *= s over n floats.
  void (*scale)(float* y, float s, int64_t n);
  // sum of x[i]² over n floats.
  float (*sum_sq)(const float* x, int64_t n);
  // y[i] = (x[i] * s) * w[i] over n floats (the RMSNorm epilogue; HF's order of rounding).
  void (*mul_scaled)(const float* x, const float* w, float s, float* y, int64_t n);
  // out[g] = q[g * q_stride : +n] · k for g < n_q: one key against the n_q query heads that share it
  // (GQA), loading the key once.
  void (*dot_multi)(const float* q, int64_t n_q, int64_t q_stride, const float* k, int64_t n, float* out);
  // acc[g * acc_stride : +n] += a[g] * v for g < n_q: one value row into n_q accumulators.
  void (*axpy_multi)(const float* a, int64_t n_q, const float* v, float* acc, int64_t acc_stride, int64_t n);
  // GEMV over a row range, streaming each weight row once for all tokens:
  //   y[t * y_stride + r] = x[t * x_stride : +in] · w[r * in : +in]   for t < n_x, r0 <= r < r1.
  // w [out, in] of dtype wt (f32/bf16/f16).
  void (*gemv)(const float* x, int64_t n_x, int64_t x_stride, const void* w, DType wt, int64_t in, int64_t r0,
               int64_t r1, float* y, int64_t y_stride);
  // Packs weight rows [r0, r0 + n_rows) x columns [k0, k0 + kc) into f32 panels of gemm_nr rows:
  //   dst[(p * kc + k) * nr + j] = w[r0 + p * nr + j][k0 + k], zero where r0 + p*nr + j >= r0 + n_rows.
  // dst holds ceil(n_rows / nr) * kc * nr floats.
  void (*gemm_pack)(const void* w, DType wt, int64_t in, int64_t r0, int64_t n_rows, int64_t k0, int64_t kc,
                    float* dst);
  // One register tile: for m < m_count (<= mr) and j < n_count (<= nr),
  //   y[m * y_stride + j] (+)= sum_{k < kc} x[m * x_stride + k] * panel[k * nr + j]
  // (overwrites when accumulate is false).
  void (*gemm_micro)(const float* x, int64_t x_stride, int64_t m_count, const float* panel, int64_t kc, float* y,
                     int64_t y_stride, int64_t n_count, bool accumulate);
  // Quantized GEMV over rows [r0, r1), reading each packed row once for all n_x tokens:
  //   y[t * y_stride + r] = sum_g scale[r,g] * (x_t[g-th group] . q[r, group g]) + bias[r,g] * xsum[t * n_groups + g]
  // xsum [n_x, n_groups] holds each token's per-group sums of x (the bias term needs no codes).
  void (*qgemv)(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                int64_t r1, float* y, int64_t y_stride);
  // dst[k] = scale * q + bias of row r, columns [k0, k0 + kc); k0 and kc multiples of group_size.
  void (*qdequant)(const QMatrix& w, int64_t r, int64_t k0, int64_t kc, float* dst);
};

// The tables; avx2/avx512 return nullptr when this build has no such translation unit.
const Kernels* kernels_scalar();
const Kernels* kernels_avx2();
const Kernels* kernels_avx512();
const Kernels* kernels_avx512vnni();

// The best level this CPU (and this build) supports.
SimdLevel best_simd_level();
// The table for a level; throws [cpu] when the CPU or the build lacks it.
const Kernels& kernels_for(SimdLevel l);
// Reads KILN_SIMD (scalar|avx2|avx512|avx512vnni; unset = best); throws [cpu] for an unknown or unsupported value.
SimdLevel simd_level_from_env();

// For the kernels: f(std::integral_constant<int, N>{}) with N = n for n in [1, MAX), else N = MAX, so that
// a kernel templated on a small count (query heads, tokens, rows of a tile) is picked without a switch.
template <int MAX, int N = 1, class F>
inline void with_count(int64_t n, F&& f) {
  if constexpr (N < MAX) {
    if (n != N) return with_count<MAX, N + 1>(n, f);
  }
  f(std::integral_constant<int, N>{});
}

}  // namespace kiln::backend::cpu
