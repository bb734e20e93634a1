// Quantized (MLX affine) kernels written once over the vector traits S, included by kernels_simd.h
// in each SIMD level's translation unit. S::codes<BITS>(p) turns the W codes whose bit stream starts
// at byte p into f32 lanes (W * BITS / 8 bytes; it may load up to 16 bytes from p, so callers near
// the end of the buffer pass a zero-padded copy). Every group holds a whole number of registers
// (group_size 32/64/128, W 8 or 16), so a register never straddles two groups.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/backend/cpu/kernels.h"

namespace kiln::backend::cpu {
namespace {

inline float q_scalar_at(const void* p, DType t, int64_t i) {
  if (t == DType::f32) return static_cast<const float*>(p)[i];
  uint16_t h = static_cast<const uint16_t*>(p)[i];
  if (t == DType::bf16) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  return f16_to_f32(h);
}

// The codes of one register at byte p of the packed data: a direct load when 16 bytes remain before
// `end`, else through a zero-padded copy (the last register of the matrix).
template <class S, int BITS>
inline typename S::V q_codes(const uint8_t* p, const uint8_t* end) {
  if (p + 16 <= end) return S::template codes<BITS>(p);
  alignas(16) uint8_t tmp[32] = {};
  std::memcpy(tmp, p, static_cast<size_t>(end - p) < 32 ? static_cast<size_t>(end - p) : 32);
  return S::template codes<BITS>(tmp);
}

// Rows [r0, r1) against NT (1..4) tokens: per group, a vector partial dot product per token,
// scaled into the token's vector accumulator (one FMA per group); the bias term is a scalar
// multiply by the precomputed group sum of x. One horizontal sum per row and token.
// SPLIT (4 bits): each W bytes (2W codes) are split into their low and high nibbles — the even and
// the odd codes — against x permuted the same way once per call (split_x), instead of
// interleaving the nibbles back into order in every row (half the shuffles per code); the even and
// odd codes keep separate partial sums.
template <class S, int BITS, int NT, bool SPLIT>
void qgemv_rows(const float* x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0, int64_t r1,
                float* y, int64_t y_stride) {
  using V = typename S::V;
  constexpr int W = S::W;
  constexpr int64_t kBytesPerReg = W * BITS / 8;
  const int64_t gs = w.group_size, n_groups = w.n_groups();
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* p = w.w + r * w.row_bytes;
    V acc[NT];
    float bsum[NT];
    for (int t = 0; t < NT; ++t) {
      acc[t] = S::zero();
      bsum[t] = 0.0f;
    }
    for (int64_t g = 0; g < n_groups; ++g) {
      const float s = q_scalar_at(w.scales, w.sdt, r * n_groups + g);
      const float b = q_scalar_at(w.biases, w.sdt, r * n_groups + g);
      __builtin_prefetch(p + 1024);
      V pe[NT], po[NT];  // even and odd codes' partial sums (SPLIT), else pe alone
      for (int t = 0; t < NT; ++t) pe[t] = po[t] = S::zero();
      const int64_t kb = g * gs;
      if constexpr (SPLIT) {
        for (int64_t k = 0; k < gs; k += 2 * W, p += W) {
          V lo, hi;
          S::nibbles(p, lo, hi);
          for (int t = 0; t < NT; ++t) {
            pe[t] = S::fma(S::load(x + t * x_stride + kb + k), lo, pe[t]);
            po[t] = S::fma(S::load(x + t * x_stride + kb + k + W), hi, po[t]);
          }
        }
      } else {
        for (int64_t k = 0; k < gs; k += W, p += kBytesPerReg) {
          const V q = q_codes<S, BITS>(p, w.end);
          for (int t = 0; t < NT; ++t) pe[t] = S::fma(S::load(x + t * x_stride + kb + k), q, pe[t]);
        }
      }
      const V vs = S::set1(s);
      for (int t = 0; t < NT; ++t) {
        acc[t] = S::fma(vs, SPLIT ? S::add(pe[t], po[t]) : pe[t], acc[t]);
        bsum[t] += b * xsum[t * n_groups + g];
      }
    }
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = S::hsum(acc[t]) + bsum[t];
  }
}

// x [n_x, in] permuted for SPLIT: per block of 2W, the W even x, then the W odd x.
template <class S>
std::vector<float> split_x(const float* x, int64_t n_x, int64_t x_stride, int64_t in) {
  constexpr int W = S::W;
  std::vector<float> xn(static_cast<size_t>(n_x * in));
  for (int64_t t = 0; t < n_x; ++t)
    for (int64_t b = 0; b < in; b += 2 * W)
      for (int i = 0; i < W; ++i) {
        xn[t * in + b + i] = x[t * x_stride + b + 2 * i];
        xn[t * in + b + W + i] = x[t * x_stride + b + 2 * i + 1];
      }
  return xn;
}

template <class S, int BITS, bool SPLIT>
void qgemv_pass(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                int64_t r1, float* y, int64_t y_stride) {
  const int64_t n_groups = w.n_groups();
  // Rows in blocks so the 1..4-token passes re-read a block that is still in L1/L2.
  constexpr int64_t kRowBlock = 8;
  for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
    const int64_t re = rb + kRowBlock < r1 ? rb + kRowBlock : r1;
    for (int64_t t0 = 0; t0 < n_x; t0 += 4) {
      const float* xt = x + t0 * x_stride;
      const float* st = xsum + t0 * n_groups;
      float* yt = y + t0 * y_stride;
      with_count<4>(n_x - t0,
                    [&](auto nt) { qgemv_rows<S, BITS, nt, SPLIT>(xt, x_stride, st, w, rb, re, yt, y_stride); });
    }
  }
}

template <class S, int BITS>
void qgemv_bits(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                int64_t r1, float* y, int64_t y_stride) {
  if constexpr (BITS == 4) {
    if (w.group_size % (2 * S::W) == 0) {
      const std::vector<float> xn = split_x<S>(x, n_x, x_stride, w.in);
      return qgemv_pass<S, BITS, true>(xn.data(), n_x, w.in, xsum, w, r0, r1, y, y_stride);
    }
  }
  qgemv_pass<S, BITS, false>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride);
}

template <class S>
void qgemv_simd(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                int64_t r1, float* y, int64_t y_stride) {
  switch (w.bits) {
    case 2: qgemv_bits<S, 2>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); break;
    case 3: qgemv_bits<S, 3>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); break;
    case 4: qgemv_bits<S, 4>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); break;
    case 5: qgemv_bits<S, 5>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); break;
    case 6: qgemv_bits<S, 6>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); break;
    default: qgemv_bits<S, 8>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); break;
  }
}

template <class S, int BITS>
void qdequant_bits(const QMatrix& w, int64_t r, int64_t k0, int64_t kc, float* dst) {
  constexpr int W = S::W;
  constexpr int64_t kBytesPerReg = W * BITS / 8;
  const int64_t gs = w.group_size, n_groups = w.n_groups();
  const uint8_t* p = w.w + r * w.row_bytes + k0 * BITS / 8;
  for (int64_t k = 0; k < kc; k += gs) {
    const int64_t g = (k0 + k) / gs;
    const typename S::V vs = S::set1(q_scalar_at(w.scales, w.sdt, r * n_groups + g));
    const typename S::V vb = S::set1(q_scalar_at(w.biases, w.sdt, r * n_groups + g));
    for (int64_t j = 0; j < gs; j += W, p += kBytesPerReg) S::store(dst + k + j, S::fma(q_codes<S, BITS>(p, w.end), vs, vb));
  }
}

template <class S>
void qdequant_simd(const QMatrix& w, int64_t r, int64_t k0, int64_t kc, float* dst) {
  switch (w.bits) {
    case 2: qdequant_bits<S, 2>(w, r, k0, kc, dst); break;
    case 3: qdequant_bits<S, 3>(w, r, k0, kc, dst); break;
    case 4: qdequant_bits<S, 4>(w, r, k0, kc, dst); break;
    case 5: qdequant_bits<S, 5>(w, r, k0, kc, dst); break;
    case 6: qdequant_bits<S, 6>(w, r, k0, kc, dst); break;
    default: qdequant_bits<S, 8>(w, r, k0, kc, dst); break;
  }
}

}  // namespace
}  // namespace kiln::backend::cpu
