// AVX2 + FMA + F16C kernels (8 f32 lanes), compiled with -mavx2 -mfma -mf16c and selected at run
// time only when the CPU reports all three. bf16 -> f32 is a zero-extend and a 16-bit shift;
// f16 -> f32 is one VCVTPH2PS. GEMM register tile: 6 tokens x 16 features (12 accumulators).
#include <immintrin.h>

#include "kiln/backend/cpu/kernels_simd.h"

namespace kiln::backend::cpu {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int W = 8, MR = 6, NR = 16;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V load_bf16(const uint16_t* p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  // In-register 8x8 transpose: r[i][j] -> r[j][i] (unpack pairs, 4x4 blocks per 128-bit lane,
  // then swap lanes).
  static void transpose(V r[8]) {
    V t[8], u[8];
    for (int g = 0; g < 2; ++g) {
      const int o = 4 * g;
      t[o] = _mm256_unpacklo_ps(r[o], r[o + 1]);
      t[o + 1] = _mm256_unpackhi_ps(r[o], r[o + 1]);
      t[o + 2] = _mm256_unpacklo_ps(r[o + 2], r[o + 3]);
      t[o + 3] = _mm256_unpackhi_ps(r[o + 2], r[o + 3]);
      u[o] = _mm256_shuffle_ps(t[o], t[o + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[o + 1] = _mm256_shuffle_ps(t[o], t[o + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[o + 2] = _mm256_shuffle_ps(t[o + 1], t[o + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[o + 3] = _mm256_shuffle_ps(t[o + 1], t[o + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    // u[c] holds column c of rows 0-3 (low lane: columns 0-3, high lane: 4-7); u[4 + c] rows 4-7.
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
  // 8 codes of BITS bits from the LSB-first stream at p (BITS bytes; loads 8): codes 0-3 sit in
  // the low 32 bits of the 64-bit window and codes 4-7 in the 32 bits from bit 4 * BITS, so both
  // halves come out of one variable shift per lane.
  template <int BITS>
  static V codes(const uint8_t* p) {
    if constexpr (BITS == 8) {
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    } else if constexpr (BITS == 4) {  // nibbles: low/high halves of 4 bytes interleaved back into order
      uint32_t u;
      std::memcpy(&u, p, 4);
      const __m128i v = _mm_cvtsi32_si128(static_cast<int>(u)), m = _mm_set1_epi8(0x0F);
      const __m128i q = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
    } else {
      uint64_t v;
      std::memcpy(&v, p, 8);
      const int lo = static_cast<int>(static_cast<uint32_t>(v));
      const int hi = static_cast<int>(static_cast<uint32_t>(v >> (4 * BITS)));
      const __m256i w = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
      const __m256i sh = _mm256_setr_epi32(0, BITS, 2 * BITS, 3 * BITS, 0, BITS, 2 * BITS, 3 * BITS);
      const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(w, sh), _mm256_set1_epi32((1 << BITS) - 1));
      return _mm256_cvtepi32_ps(q);
    }
  }
  // The 16 codes of 8 bytes of a 4-bit stream at p, split: lo = the low nibbles (codes 0, 2, ..., 14),
  // hi = the high nibbles (codes 1, 3, ..., 15).
  static void nibbles(const uint8_t* p, V& lo, V& hi) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(0x0F);
    lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(v, m)));
    hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), m)));
  }
  static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

// constexpr: a constant table, ready before any static initializer could ask for it.
constexpr Kernels kAvx2 = make_kernels<Avx2>(SimdLevel::avx2);

}  // namespace

const Kernels* kernels_avx2() { return &kAvx2; }

}  // namespace kiln::backend::cpu
