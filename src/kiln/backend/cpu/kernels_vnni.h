// The integer-dot-product GEMVs of the avx512vnni level (VPDPBUSD: 4 u8 codes x 4 s8 activations
// summed into each s32 lane), shared by kernels_avx512vnni.cpp (4 and 8 bits) and
// kernels_avx512vbmi.cpp (2, 3, 5, 6 bits, whose codes VBMI spreads to a byte each); include it only
// from translation units compiled with -mavx512vnni. The float GEMV converts every code to f32 (two
// FMAs per 16 codes and token); here a block of a row is one load and a few byte operations, then
// three dot-product instructions per 64 codes and token.
//
// The activations are quantized per group to 23 bits, so that the result differs from the float
// GEMV's by f32 rounding only: v = rint(x / d) with d = max|x| / (127 * 254 * 254) (|v| < 2^23, the
// error at most d / 2), split exactly into three signed digits v = 254² a + 254 b + c, each in
// [-127, 127]. Per (row, group, token):
//   y += scale · d · (254² C_a + 254 C_b + C_c) + bias · S     (C = Σ q · a|b|c over the group, S = Σ x).
// Rows are LSB-first bit streams (MLX's packing). Byte i of a 4-bit row holds codes 2i (low nibble)
// and 2i + 1 (high nibble), so a 4-bit block's codes fall into P = 2 "phases" (its 64 low nibbles,
// its 64 high ones), each against its own copy of x (x[P i + j] at byte i of phase j); other widths
// have one phase of 64 codes. Dword lane L of a block's sums covers codes 4PL..4PL+4P-1 of the
// block's 64P, which are in one group (group sizes 32/64/128).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "kiln/backend/cpu/kernels.h"

namespace kiln::backend::cpu {

// The GEMV of the 2, 3, 5 and 6-bit widths (kernels_avx512vbmi.cpp): false when this build has no
// VBMI translation unit or the CPU lacks AVX-512 VBMI (the caller then uses the float GEMV).
bool qgemv_vbmi(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                int64_t r1, float* y, int64_t y_stride);

// Internal linkage: each including translation unit (compiled with its own -m flags) keeps its own
// copies, so the linker never hands the VNNI one a VBMI-compiled function.
namespace {

constexpr int kDigits = 3;                          // a, b, c
constexpr float kRange = 127.0f * 254.0f * 254.0f;  // max |v|
constexpr int64_t kLane = 64;                       // codes of a phase of a block: a byte each

// A block of a row: 4 bits, 64 bytes split into its low and high nibbles (P = 2 phases: the even and
// the odd codes); 8 bits, 64 bytes; 2, 3, 5, 6 bits (VBMI), the 8 * BITS bytes of 64 codes spread to
// a byte each.
template <int BITS>
struct Packing {
  static constexpr int P = BITS == 4 ? 2 : 1;               // phases
  static constexpr int64_t kCodes = kLane * P;              // codes per block
  static constexpr int64_t kBytes = kCodes * BITS / 8;      // packed bytes per block
  static constexpr int64_t kQx = kDigits * P * kLane;       // x per block and token: [digit][phase][64]
};

// The codes of the block at p (left: bytes from p to the row's end) by phase, a byte each
// (zeros past the row: masked loads never touch memory past it).
template <int BITS>
inline void block_codes(const uint8_t* p, int64_t left, __m512i (&ph)[Packing<BITS>::P]) {
  using K = Packing<BITS>;
  const int64_t n = left < K::kBytes ? left : K::kBytes;
  const __m512i v = n == 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8((~__mmask64{0}) >> (64 - n), p);
  if constexpr (BITS == 8) {
    ph[0] = v;
  } else if constexpr (BITS == 4) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    ph[0] = _mm512_and_si512(v, low), ph[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  } else {
#ifdef __AVX512VBMI__
    // Qword k takes the BITS bytes of codes 8k..8k+7 (VPERMB), then byte i of it the 8 bits at bit
    // i * BITS (VPMULTISHIFTQB), masked to the code.
    alignas(64) static constexpr auto kTables = [] {
      struct { uint8_t idx[64], shift[64]; } t{};
      for (int j = 0; j < 64; ++j) {
        const int k = j / 8, i = j % 8;
        t.idx[j] = static_cast<uint8_t>(k * BITS + (i < BITS ? i : 0));
        t.shift[j] = static_cast<uint8_t>(i * BITS);
      }
      return t;
    }();
    const __m512i spread = _mm512_permutexvar_epi8(_mm512_load_si512(kTables.idx), v);
    ph[0] = _mm512_and_si512(_mm512_multishift_epi64_epi8(_mm512_load_si512(kTables.shift), spread),
                             _mm512_set1_epi8(static_cast<char>((1 << BITS) - 1)));
#else
    static_assert(BITS == 4 || BITS == 8, "2, 3, 5 and 6 bits need AVX-512 VBMI (kernels_avx512vbmi.cpp)");
#endif
  }
}

// A mask of the first n (<= 16) lanes.
inline __mmask16 first_lanes(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1); }

// n values of a scale/bias row (f32, bf16 or f16) from element i0 of p, as f32 into dst.
inline void row_to_f32(const void* p, DType t, int64_t i0, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
    __m512 v;
    if (t == DType::f32) {
      v = _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i0 + i);
    } else {
      const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i0 + i);
      v = t == DType::bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
    }
    _mm512_mask_storeu_ps(dst + i, m, v);
  }
}

// 16 values v (rint(x / d) as floats, |v| <= kRange) as their three digits, 16 int8 each, at dst +
// k * stride. Each digit is rint(rest / 254^k), so a rounding flip at a half only moves the rest to
// the other end of its range.
inline void store_digits(__m512 v, int8_t* dst, int64_t stride) {
  const __m512i lim = _mm512_set1_epi32(127), neg = _mm512_set1_epi32(-127);
  __m512 rest = v;
  for (int k = 0; k < kDigits; ++k) {
    const float unit = k == 0 ? 254.0f * 254.0f : k == 1 ? 254.0f : 1.0f;
    const __m512i q = _mm512_cvtps_epi32(k == 2 ? rest : _mm512_mul_ps(rest, _mm512_set1_ps(1.0f / unit)));
    const __m512i digit = _mm512_max_epi32(_mm512_min_epi32(q, lim), neg);
    rest = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(digit), _mm512_set1_ps(unit), rest);  // exact: |values| < 2^24
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k * stride), _mm512_cvtepi32_epi8(digit));
  }
}

// Token x [in] (in a multiple of group_size 32/64/128) into blocks of Packing::kQx bytes (zeros
// past in) and d [n_groups].
template <int BITS>
void quantize_x(const float* x, int64_t in, int gs, int8_t* qx, float* d) {
  using K = Packing<BITS>;
  const int64_t n_groups = in / gs;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t g = 0; g < n_groups; ++g) {
    __m512 m = _mm512_setzero_ps();
    for (int k = 0; k < gs; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + g * gs + k)));
    const float amax = _mm512_reduce_max_ps(m);
    d[g] = amax / kRange;
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? kRange / amax : 0.0f), lim = _mm512_set1_ps(kRange);
    auto scaled = [&](__m512 xv) {  // rint(x / d), clamped (x * inv may round past the range)
      const __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(xv, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      return _mm512_max_ps(_mm512_min_ps(v, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
    };
    for (int k = 0; k < gs; k += 16 * K::P) {  // the codes of 16 bytes
      const int64_t c = g * gs + k;
      int8_t* blk = qx + (c / K::kCodes) * K::kQx + (c / K::P) % kLane;
      if constexpr (K::P == 1) {
        store_digits(scaled(_mm512_loadu_ps(x + c)), blk, kLane);
      } else {  // phase 0: the even codes, phase 1: the odd ones
        const __m512 a = _mm512_loadu_ps(x + c), b = _mm512_loadu_ps(x + c + 16);
        store_digits(scaled(_mm512_permutex2var_ps(a, even, b)), blk, 2 * kLane);
        store_digits(scaled(_mm512_permutex2var_ps(a, odd, b)), blk + kLane, 2 * kLane);
      }
    }
  }
}

// Rows [r0, r1) against NT tokens: qx [NT][blocks * kQx], d [NT][n_groups].
template <int BITS, int NT>
void qgemv_rows(const int8_t* qx, int64_t qx_stride, const float* d, const float* xsum, const QMatrix& w,
                int64_t r0, int64_t r1, float* y, int64_t y_stride, std::vector<float>& sb) {
  using K = Packing<BITS>;
  const int gs = w.group_size;
  const int64_t n_groups = w.n_groups(), bytes = w.in * BITS / 8, blocks = (w.in + K::kCodes - 1) / K::kCodes;
  const int64_t gpb = K::kCodes >= gs ? K::kCodes / gs : 1;  // groups a block touches
  // Lane L's group within its block: 4 P L / gs (lanes per group: a power of two).
  const int lanes_per_group = gs / (4 * K::P);
  const __m512i lane_group = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               __builtin_ctz(static_cast<unsigned>(lanes_per_group)));
  const __m512 k254 = _mm512_set1_ps(254.0f), k254sq = _mm512_set1_ps(254.0f * 254.0f);
  sb.resize(2 * n_groups);
  float* s = sb.data();
  float* bias = s + n_groups;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* p = w.w + r * w.row_bytes;
    row_to_f32(w.scales, w.sdt, r * n_groups, n_groups, s);
    row_to_f32(w.biases, w.sdt, r * n_groups, n_groups, bias);
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      __m512i ph[K::P];  // the block's codes by phase, a byte each
      block_codes<BITS>(p + b * K::kBytes, bytes - b * K::kBytes, ph);
      const int64_t g0 = b * K::kCodes / gs, ng = n_groups - g0 < gpb ? n_groups - g0 : gpb;
      const __mmask16 gm = first_lanes(ng);
      const __m512 sv = _mm512_permutexvar_ps(lane_group, _mm512_maskz_loadu_ps(gm, s + g0));
      for (int t = 0; t < NT; ++t) {
        const int8_t* xb = qx + t * qx_stride + b * K::kQx;
        __m512 cd[kDigits];  // Σ q · digit per lane (exact: |C| < 2^24)
        for (int k = 0; k < kDigits; ++k) {
          __m512i e = _mm512_setzero_si512();
          for (int j = 0; j < K::P; ++j)
            e = _mm512_dpbusd_epi32(e, ph[j], _mm512_loadu_si512(xb + (k * K::P + j) * kLane));
          cd[k] = _mm512_cvtepi32_ps(e);
        }
        const __m512 c = _mm512_fmadd_ps(cd[0], k254sq, _mm512_fmadd_ps(cd[1], k254, cd[2]));
        const __m512 dv = _mm512_permutexvar_ps(lane_group, _mm512_maskz_loadu_ps(gm, d + t * n_groups + g0));
        acc[t] = _mm512_fmadd_ps(c, _mm512_mul_ps(sv, dv), acc[t]);
      }
    }
    for (int64_t g = 0; g < n_groups; g += 16) {  // the bias terms, bias · Σx per group
      const __mmask16 m = first_lanes(n_groups - g);
      const __m512 bv = _mm512_maskz_loadu_ps(m, bias + g);
      for (int t = 0; t < NT; ++t) acc[t] = _mm512_fmadd_ps(bv, _mm512_maskz_loadu_ps(m, xsum + t * n_groups + g), acc[t]);
    }
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = _mm512_reduce_add_ps(acc[t]);
  }
}

template <int BITS>
void qgemv_bits(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                int64_t r1, float* y, int64_t y_stride) {
  using K = Packing<BITS>;
  const int64_t n_groups = w.n_groups(), blocks = (w.in + K::kCodes - 1) / K::kCodes;
  const int64_t qx_stride = blocks * K::kQx;
  thread_local std::vector<int8_t> qx;
  thread_local std::vector<float> d, sb;
  qx.assign(static_cast<size_t>(n_x * qx_stride), 0);
  d.resize(static_cast<size_t>(n_x * n_groups));
  for (int64_t t = 0; t < n_x; ++t)
    quantize_x<BITS>(x + t * x_stride, w.in, w.group_size, qx.data() + t * qx_stride, d.data() + t * n_groups);
  for (int64_t t0 = 0; t0 < n_x; t0 += 4) {
    const int8_t* q = qx.data() + t0 * qx_stride;
    const float* dt = d.data() + t0 * n_groups;
    const float* st = xsum + t0 * n_groups;
    float* yt = y + t0 * y_stride;
    with_count<4>(n_x - t0, [&](auto nt) { qgemv_rows<BITS, nt>(q, qx_stride, dt, st, w, r0, r1, yt, y_stride, sb); });
  }
}

}  // namespace
}  // namespace kiln::backend::cpu
