// AVX-512 (F, BW, VL) kernels (16 f32 lanes), compiled with -mavx512f -mavx512bw -mavx512vl and
// selected at run time only when the CPU reports them. Same algorithms as AVX2 with twice the
// lanes; the GEMM register tile is 8 tokens x 32 features (16 of the 32 zmm registers).
// GCC 12's avx512fintrin.h builds some conversions from _mm512_undefined_*() and warns about it
// (-Wuninitialized false positives inside the header); the values are fully overwritten.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kiln/backend/cpu/kernels_simd.h"

namespace kiln::backend::cpu {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int W = 16, MR = 12, NR = 32;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V load_bf16(const uint16_t* p) {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  // In-register 16x16 transpose: r[i][j] -> r[j][i]. Within each 128-bit lane, unpacks and
  // shuffles transpose the 4x4 blocks of each group of four rows (u[4g + c] = column c of rows
  // 4g..4g+3, lane L covering columns 4L..4L+3); then a 4x4 transpose of 128-bit lanes across
  // u[c], u[4 + c], u[8 + c], u[12 + c] yields columns c, 4 + c, 8 + c, 12 + c.
  static void transpose(V r[16]) {
    V t[16], u[16];
    for (int g = 0; g < 4; ++g) {
      const int o = 4 * g;
      t[o] = _mm512_unpacklo_ps(r[o], r[o + 1]);
      t[o + 1] = _mm512_unpackhi_ps(r[o], r[o + 1]);
      t[o + 2] = _mm512_unpacklo_ps(r[o + 2], r[o + 3]);
      t[o + 3] = _mm512_unpackhi_ps(r[o + 2], r[o + 3]);
      u[o] = _mm512_shuffle_ps(t[o], t[o + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[o + 1] = _mm512_shuffle_ps(t[o], t[o + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[o + 2] = _mm512_shuffle_ps(t[o + 1], t[o + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[o + 3] = _mm512_shuffle_ps(t[o + 1], t[o + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; ++c) {
      const V a01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);   // [A0 A1 B0 B1]
      const V a23 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);   // [A2 A3 B2 B3]
      const V c01 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
      const V c23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
      r[c] = _mm512_shuffle_f32x4(a01, c01, 0x88);       // lane 0 of A, B, C, D
      r[4 + c] = _mm512_shuffle_f32x4(a01, c01, 0xDD);   // lane 1
      r[8 + c] = _mm512_shuffle_f32x4(a23, c23, 0x88);   // lane 2
      r[12 + c] = _mm512_shuffle_f32x4(a23, c23, 0xDD);  // lane 3
    }
  }
  // 16 codes of BITS bits from the LSB-first stream at p (2 * BITS bytes; loads up to 16): two
  // 8-code halves (the second starts at byte BITS), each as in the AVX2 traits, joined.
  template <int BITS>
  static __m256i codes8(const uint8_t* p) {
    if constexpr (BITS == 8) {
      return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    } else {
      uint64_t v;
      std::memcpy(&v, p, 8);
      const int lo = static_cast<int>(static_cast<uint32_t>(v));
      const int hi = static_cast<int>(static_cast<uint32_t>(v >> (4 * BITS)));
      const __m256i w = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
      const __m256i sh = _mm256_setr_epi32(0, BITS, 2 * BITS, 3 * BITS, 0, BITS, 2 * BITS, 3 * BITS);
      return _mm256_and_si256(_mm256_srlv_epi32(w, sh), _mm256_set1_epi32((1 << BITS) - 1));
    }
  }
  template <int BITS>
  static V codes(const uint8_t* p) {
    if constexpr (BITS == 4) {  // 8 bytes of nibbles: low/high halves interleaved back into order
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(0x0F);
      const __m128i q = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
      return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q));
    }
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(codes8<BITS>(p)), codes8<BITS>(p + BITS), 1);
    return _mm512_cvtepi32_ps(q);
  }
  // The 32 codes of 16 bytes of a 4-bit stream at p, split: lo = the low nibbles (codes 0, 2, ..., 30),
  // hi = the high nibbles (codes 1, 3, ..., 31).
  static void nibbles(const uint8_t* p, V& lo, V& hi) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(0x0F);
    lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, m)));
    hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), m)));
  }
  static float hsum(V v) { return _mm512_reduce_add_ps(v); }
};

// constexpr: a constant table, ready before any static initializer could ask for it.
constexpr Kernels kAvx512 = make_kernels<Avx512>(SimdLevel::avx512);

}  // namespace

const Kernels* kernels_avx512() { return &kAvx512; }

}  // namespace kiln::backend::cpu
