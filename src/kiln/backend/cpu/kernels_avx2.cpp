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
  static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

const Kernels kAvx2 = make_kernels<Avx2>(SimdLevel::avx2);

}  // namespace

const Kernels* kernels_avx2() { return &kAvx2; }

}  // namespace kiln::backend::cpu
