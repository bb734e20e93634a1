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
  static constexpr int W = 16, MR = 8, NR = 32;
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
  static float hsum(V v) { return _mm512_reduce_add_ps(v); }
};

const Kernels kAvx512 = make_kernels<Avx512>(SimdLevel::avx512);

}  // namespace

const Kernels* kernels_avx512() { return &kAvx512; }

}  // namespace kiln::backend::cpu
