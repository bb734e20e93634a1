// The SIMD kernels written once over a vector-traits type S (S::V a register of S::W floats), and
// included by each level's translation unit (kernels_avx2.cpp, kernels_avx512.cpp) under its own
// -m flags. Everything here sits in an anonymous namespace and calls no inline library templates,
// so no AVX-512 instantiation can be merged (ODR) into code that runs on a lesser CPU.
// Tails shorter than a register run as scalar loops.
#pragma once
#include <cstdint>
#include <cstring>

#include "kiln/backend/cpu/kernels.h"
#include "kiln/backend/cpu/kernels_q_simd.h"

namespace kiln::backend::cpu {
namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline float bf16_scalar(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// One weight element as f32 (scalar tails).
template <DType WT>
inline float load1(const void* p, int64_t i) {
  if constexpr (WT == DType::f32) return static_cast<const float*>(p)[i];
  else if constexpr (WT == DType::bf16) return bf16_scalar(static_cast<const uint16_t*>(p)[i]);
  else return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

// S::W weight elements starting at element i, as f32 lanes.
template <class S, DType WT>
inline typename S::V loadw(const void* p, int64_t i) {
  if constexpr (WT == DType::f32) return S::load(static_cast<const float*>(p) + i);
  else if constexpr (WT == DType::bf16) return S::load_bf16(static_cast<const uint16_t*>(p) + i);
  else return S::load_f16(static_cast<const uint16_t*>(p) + i);
}

template <class S, DType WT>
void to_f32_t(const void* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(dst + i, loadw<S, WT>(src, i));
  for (; i < n; ++i) dst[i] = load1<WT>(src, i);
}

template <class S>
void to_f32_simd(const void* src, DType t, float* dst, int64_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); break;
    case DType::bf16: to_f32_t<S, DType::bf16>(src, dst, n); break;
    default: to_f32_t<S, DType::f16>(src, dst, n); break;
  }
}

// a·b with four independent accumulators (FMA latency 4 cycles, two ports).
template <class S>
float dot_simd(const float* a, const float* b, int64_t n) {
  using V = typename S::V;
  V s0 = S::zero(), s1 = S::zero(), s2 = S::zero(), s3 = S::zero();
  int64_t i = 0;
  for (; i + 4 * S::W <= n; i += 4 * S::W) {
    s0 = S::fma(S::load(a + i), S::load(b + i), s0);
    s1 = S::fma(S::load(a + i + S::W), S::load(b + i + S::W), s1);
    s2 = S::fma(S::load(a + i + 2 * S::W), S::load(b + i + 2 * S::W), s2);
    s3 = S::fma(S::load(a + i + 3 * S::W), S::load(b + i + 3 * S::W), s3);
  }
  for (; i + S::W <= n; i += S::W) s0 = S::fma(S::load(a + i), S::load(b + i), s0);
  float r = S::hsum(S::add(S::add(s0, s1), S::add(s2, s3)));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

template <class S>
void axpy_simd(float a, const float* x, float* y, int64_t n) {
  const typename S::V va = S::set1(a);
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(y + i, S::fma(va, S::load(x + i), S::load(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

template <class S>
void scale_simd(float* y, float s, int64_t n) {
  const typename S::V vs = S::set1(s);
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(y + i, S::mul(S::load(y + i), vs));
  for (; i < n; ++i) y[i] *= s;
}

template <class S>
float sum_sq_simd(const float* x, int64_t n) { return dot_simd<S>(x, x, n); }

template <class S>
void mul_scaled_simd(const float* x, const float* w, float s, float* y, int64_t n) {
  const typename S::V vs = S::set1(s);
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(y + i, S::mul(S::mul(S::load(x + i), vs), S::load(w + i)));
  for (; i < n; ++i) y[i] = (x[i] * s) * w[i];
}

// ---- Attention inner loops: one key (value) row against NQ query heads (accumulators), so a
// GQA group reads each cached row once. Heads beyond 8 go in further passes.
template <class S, int NQ>
inline void dot_multi_t(const float* q, int64_t q_stride, const float* k, int64_t n, float* out) {
  using V = typename S::V;
  V acc[NQ];
  for (int g = 0; g < NQ; ++g) acc[g] = S::zero();
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) {
    const V kv = S::load(k + i);
    for (int g = 0; g < NQ; ++g) acc[g] = S::fma(S::load(q + g * q_stride + i), kv, acc[g]);
  }
  for (int g = 0; g < NQ; ++g) {
    float r = S::hsum(acc[g]);
    for (int64_t j = i; j < n; ++j) r += q[g * q_stride + j] * k[j];
    out[g] = r;
  }
}

template <class S>
void dot_multi_simd(const float* q, int64_t n_q, int64_t q_stride, const float* k, int64_t n, float* out) {
  for (int64_t g0 = 0; g0 < n_q; g0 += 8) {
    const float* qg = q + g0 * q_stride;
    float* o = out + g0;
    with_count<8>(n_q - g0, [&](auto nq) { dot_multi_t<S, nq>(qg, q_stride, k, n, o); });
  }
}

template <class S>
void axpy_multi_simd(const float* a, int64_t n_q, const float* v, float* acc, int64_t acc_stride, int64_t n) {
  using V = typename S::V;
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) {
    const V vv = S::load(v + i);
    for (int64_t g = 0; g < n_q; ++g) {
      float* ag = acc + g * acc_stride + i;
      S::store(ag, S::fma(S::set1(a[g]), vv, S::load(ag)));
    }
  }
  for (; i < n; ++i)
    for (int64_t g = 0; g < n_q; ++g) acc[g * acc_stride + i] += a[g] * v[i];
}

// ---- GEMV: one weight row against NT (1..4) tokens over k in [0, kn); each weight vector is
// loaded (and converted) once and multiplied into every token's accumulators, U independent FMA
// chains per token. Adds the partial dot products into y[t * y_stride].
template <class S, DType WT, int NT>
inline void gemv_row(const float* x, int64_t x_stride, const void* row, int64_t kn, float* y, int64_t y_stride) {
  using V = typename S::V;
  constexpr int U = NT == 1 ? 4 : NT == 2 ? 3 : 2;
  V acc[NT][U];
  for (int t = 0; t < NT; ++t)
    for (int u = 0; u < U; ++u) acc[t][u] = S::zero();
  constexpr int64_t esz = WT == DType::f32 ? 4 : 2, kPrefetchBytes = 2048;
  const char* row_bytes = static_cast<const char*>(row);
  int64_t k = 0;
  for (; k + U * S::W <= kn; k += U * S::W) {
    // Software prefetch 2 KiB ahead on the weight stream (measured a little over the hardware
    // prefetcher alone on DRAM-resident weights); prefetches never fault past the end.
    for (int64_t b = 0; b < U * S::W * esz; b += 64) __builtin_prefetch(row_bytes + k * esz + b + kPrefetchBytes);
    V w[U];
    for (int u = 0; u < U; ++u) w[u] = loadw<S, WT>(row, k + u * S::W);
    for (int t = 0; t < NT; ++t)
      for (int u = 0; u < U; ++u) acc[t][u] = S::fma(S::load(x + t * x_stride + k + u * S::W), w[u], acc[t][u]);
  }
  for (; k + S::W <= kn; k += S::W) {
    V w = loadw<S, WT>(row, k);
    for (int t = 0; t < NT; ++t) acc[t][0] = S::fma(S::load(x + t * x_stride + k), w, acc[t][0]);
  }
  for (int t = 0; t < NT; ++t) {
    V s = acc[t][0];
    for (int u = 1; u < U; ++u) s = S::add(s, acc[t][u]);
    float r = S::hsum(s);
    for (int64_t kk = k; kk < kn; ++kk) r += x[t * x_stride + kk] * load1<WT>(row, kk);
    y[t * y_stride] += r;
  }
}

// Rows [r0, r1) in blocks of kRowBlock; within a block, k runs in chunks sized so the chunk of the
// (up to 4) token rows of x stays in L1 (24 KiB) while the block's weight rows stream past it.
// With one token and in <= 6144 this is one chunk: each weight row is read once, start to end.
template <class S, DType WT>
void gemv_t(const float* x, int64_t n_x, int64_t x_stride, const void* w, int64_t in, int64_t r0, int64_t r1,
            float* y, int64_t y_stride) {
  constexpr int64_t esz = WT == DType::f32 ? 4 : 2, kRowBlock = 16;
  const int64_t kc_max = (24 * 1024 / 4 / min64(4, n_x)) / (4 * S::W) * (4 * S::W);
  for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
    const int64_t re = min64(r1, rb + kRowBlock);
    for (int64_t t = 0; t < n_x; ++t)
      for (int64_t r = rb; r < re; ++r) y[t * y_stride + r] = 0.0f;
    for (int64_t k0 = 0; k0 < in; k0 += kc_max) {
      const int64_t kn = min64(kc_max, in - k0);
      for (int64_t r = rb; r < re; ++r) {
        const void* row = static_cast<const char*>(w) + (r * in + k0) * esz;
        for (int64_t t0 = 0; t0 < n_x; t0 += 4) {
          const float* xt = x + t0 * x_stride + k0;
          float* yt = y + t0 * y_stride + r;
          with_count<4>(n_x - t0, [&](auto nt) { gemv_row<S, WT, nt>(xt, x_stride, row, kn, yt, y_stride); });
        }
      }
    }
  }
}

template <class S>
void gemv_simd(const float* x, int64_t n_x, int64_t x_stride, const void* w, DType wt, int64_t in, int64_t r0,
               int64_t r1, float* y, int64_t y_stride) {
  switch (wt) {
    case DType::f32: gemv_t<S, DType::f32>(x, n_x, x_stride, w, in, r0, r1, y, y_stride); break;
    case DType::bf16: gemv_t<S, DType::bf16>(x, n_x, x_stride, w, in, r0, r1, y, y_stride); break;
    default: gemv_t<S, DType::f16>(x, n_x, x_stride, w, in, r0, r1, y, y_stride); break;
  }
}

// ---- GEMM packing: panels of NR weight rows, transposed to [k][NR] so the microkernel loads NR
// consecutive output features per k. W rows x W columns are loaded (converted to f32), transposed
// in registers (S::transpose) and stored as W panel rows; a k tail shorter than W goes scalar.
// Rows past n_rows (the matrix edge) are packed as zeros, so the microkernel never branches.
template <class S, DType WT>
void gemm_pack_t(const void* w, int64_t in, int64_t r0, int64_t n_rows, int64_t k0, int64_t kc, float* dst) {
  using V = typename S::V;
  constexpr int W = S::W, NR = S::NR;
  constexpr int64_t esz = WT == DType::f32 ? 4 : 2;
  const char* base = static_cast<const char*>(w) + (r0 * in + k0) * esz;
  for (int64_t p = 0; p * NR < n_rows; ++p) {
    float* panel = dst + p * kc * NR;
    for (int h = 0; h < NR / W; ++h) {
      const int64_t j0 = p * NR + h * W;  // first row of this W-row group, relative to r0
      const int64_t rows_here = min64(W, n_rows - j0);
      int64_t k = 0;
      for (; k + W <= kc; k += W) {
        V v[W];
        for (int i = 0; i < W; ++i)
          v[i] = i < rows_here ? loadw<S, WT>(base + (j0 + i) * in * esz, k) : S::zero();
        S::transpose(v);
        for (int i = 0; i < W; ++i) S::store(panel + (k + i) * NR + h * W, v[i]);
      }
      for (; k < kc; ++k)
        for (int i = 0; i < W; ++i)
          panel[k * NR + h * W + i] = i < rows_here ? load1<WT>(base + (j0 + i) * in * esz, k) : 0.0f;
    }
  }
}

template <class S>
void gemm_pack_simd(const void* w, DType wt, int64_t in, int64_t r0, int64_t n_rows, int64_t k0, int64_t kc,
                    float* dst) {
  switch (wt) {
    case DType::f32: gemm_pack_t<S, DType::f32>(w, in, r0, n_rows, k0, kc, dst); break;
    case DType::bf16: gemm_pack_t<S, DType::bf16>(w, in, r0, n_rows, k0, kc, dst); break;
    default: gemm_pack_t<S, DType::f16>(w, in, r0, n_rows, k0, kc, dst); break;
  }
}

// ---- GEMM microkernel: M tokens x NR (= 2 registers) features, M*2 accumulators held in
// registers across the whole k loop; one broadcast of x per (m, k), two panel loads per k.
template <class S, int M>
void gemm_micro_t(const float* x, int64_t x_stride, const float* panel, int64_t kc, float* y, int64_t y_stride,
                  int64_t n_count, bool accumulate) {
  using V = typename S::V;
  constexpr int W = S::W, NR = S::NR;
  static_assert(NR == 2 * W, "the microkernel holds two registers per row");
  V acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = S::zero();
  for (int64_t k = 0; k < kc; ++k) {
    const V w0 = S::load(panel + k * NR), w1 = S::load(panel + k * NR + W);
    for (int m = 0; m < M; ++m) {
      const V xb = S::set1(x[m * x_stride + k]);
      acc[m][0] = S::fma(xb, w0, acc[m][0]);
      acc[m][1] = S::fma(xb, w1, acc[m][1]);
    }
  }
  if (n_count == NR) {
    for (int m = 0; m < M; ++m) {
      float* ym = y + m * y_stride;
      if (accumulate) {
        acc[m][0] = S::add(acc[m][0], S::load(ym));
        acc[m][1] = S::add(acc[m][1], S::load(ym + W));
      }
      S::store(ym, acc[m][0]);
      S::store(ym + W, acc[m][1]);
    }
  } else {  // the matrix edge: only n_count features exist in y
    alignas(64) float tmp[NR];
    for (int m = 0; m < M; ++m) {
      S::store(tmp, acc[m][0]);
      S::store(tmp + W, acc[m][1]);
      float* ym = y + m * y_stride;
      for (int64_t j = 0; j < n_count; ++j) ym[j] = accumulate ? ym[j] + tmp[j] : tmp[j];
    }
  }
}

template <class S>
void gemm_micro_simd(const float* x, int64_t x_stride, int64_t m_count, const float* panel, int64_t kc, float* y,
                     int64_t y_stride, int64_t n_count, bool accumulate) {
  with_count<S::MR>(m_count,
                    [&](auto m) { gemm_micro_t<S, m>(x, x_stride, panel, kc, y, y_stride, n_count, accumulate); });
}

template <class S>
constexpr Kernels make_kernels(SimdLevel level) {
  Kernels k;
  k.level = level;
  k.gemm_mr = S::MR;
  k.gemm_nr = S::NR;
  k.to_f32 = to_f32_simd<S>;
  k.dot = dot_simd<S>;
  k.axpy = axpy_simd<S>;
  k.scale = scale_simd<S>;
  k.sum_sq = sum_sq_simd<S>;
  k.mul_scaled = mul_scaled_simd<S>;
  k.dot_multi = dot_multi_simd<S>;
  k.axpy_multi = axpy_multi_simd<S>;
  k.gemv = gemv_simd<S>;
  k.gemm_pack = gemm_pack_simd<S>;
  k.gemm_micro = gemm_micro_simd<S>;
  k.qgemv = qgemv_simd<S>;
  k.qdequant = qdequant_simd<S>;
  return k;
}

}  // namespace
}  // namespace kiln::backend::cpu
