// Scalar kernels: the portable fallback and the plain statement of what every SIMD level computes.
// Compiled with the baseline flags only (the compiler may still use SSE2). Also holds the level
// selection (CPU feature checks, KILN_SIMD).
#include <cpuid.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kiln/backend/cpu/kernels.h"

namespace kiln::backend::cpu {

// kernels_q_scalar.cpp
void qgemv_scalar(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                  int64_t r1, float* y, int64_t y_stride);
void qdequant_scalar(const QMatrix& w, int64_t r, int64_t k0, int64_t kc, float* dst);

// Element i of an f32, bf16 or f16 array (kernels_q_scalar.cpp reads scales and biases with it).
float load_scalar(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

namespace {

void to_f32_scalar(const void* src, DType t, float* dst, int64_t n) {
  if (t == DType::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = load_scalar(src, t, i);
}

// Four partial sums keep the dependency chain short (and let the compiler use SSE lanes).
float dot_scalar(const float* a, const float* b, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale_scalar(float* y, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

float sum_sq_scalar(const float* x, int64_t n) { return dot_scalar(x, x, n); }

void mul_scaled_scalar(const float* x, const float* w, float s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * s) * w[i];
}

void dot_multi_scalar(const float* q, int64_t n_q, int64_t q_stride, const float* k, int64_t n, float* out) {
  for (int64_t g = 0; g < n_q; ++g) out[g] = dot_scalar(q + g * q_stride, k, n);
}

void axpy_multi_scalar(const float* a, int64_t n_q, const float* v, float* acc, int64_t acc_stride, int64_t n) {
  for (int64_t g = 0; g < n_q; ++g) axpy_scalar(a[g], v, acc + g * acc_stride, n);
}

// Per weight row: convert a chunk of the row to f32 once, then dot it with every token.
void gemv_scalar(const float* x, int64_t n_x, int64_t x_stride, const void* w, DType wt, int64_t in, int64_t r0,
                 int64_t r1, float* y, int64_t y_stride) {
  constexpr int64_t kChunk = 512;
  float buf[kChunk];
  const size_t esz = dtype_size(wt);
  for (int64_t r = r0; r < r1; ++r) {
    const char* row = static_cast<const char*>(w) + static_cast<size_t>(r) * in * esz;
    for (int64_t t = 0; t < n_x; ++t) y[t * y_stride + r] = 0.0f;
    for (int64_t k0 = 0; k0 < in; k0 += kChunk) {
      int64_t kc = std::min(kChunk, in - k0);
      if (wt != DType::f32) to_f32_scalar(row + k0 * esz, wt, buf, kc);
      const float* wr = wt == DType::f32 ? reinterpret_cast<const float*>(row) + k0 : buf;
      for (int64_t t = 0; t < n_x; ++t) y[t * y_stride + r] += dot_scalar(x + t * x_stride + k0, wr, kc);
    }
  }
}

constexpr int kScalarMr = 4, kScalarNr = 4;

void gemm_pack_scalar(const void* w, DType wt, int64_t in, int64_t r0, int64_t n_rows, int64_t k0, int64_t kc,
                      float* dst) {
  const int64_t nr = kScalarNr;
  const size_t esz = dtype_size(wt);
  for (int64_t p = 0; p * nr < n_rows; ++p) {
    float* panel = dst + p * kc * nr;
    for (int64_t j = 0; j < nr; ++j) {
      int64_t r = p * nr + j;
      if (r >= n_rows) {
        for (int64_t k = 0; k < kc; ++k) panel[k * nr + j] = 0.0f;
        continue;
      }
      const char* row = static_cast<const char*>(w) + (static_cast<size_t>(r0 + r) * in + k0) * esz;
      for (int64_t k = 0; k < kc; ++k) panel[k * nr + j] = load_scalar(row, wt, k);
    }
  }
}

void gemm_micro_scalar(const float* x, int64_t x_stride, int64_t m_count, const float* panel, int64_t kc, float* y,
                       int64_t y_stride, int64_t n_count, bool accumulate) {
  float acc[kScalarMr][kScalarNr] = {};
  for (int64_t k = 0; k < kc; ++k) {
    const float* pk = panel + k * kScalarNr;
    for (int64_t m = 0; m < m_count; ++m) {
      float xv = x[m * x_stride + k];
      for (int j = 0; j < kScalarNr; ++j) acc[m][j] += xv * pk[j];
    }
  }
  for (int64_t m = 0; m < m_count; ++m)
    for (int64_t j = 0; j < n_count; ++j) {
      float& d = y[m * y_stride + j];
      d = accumulate ? d + acc[m][j] : acc[m][j];
    }
}

// constexpr: a constant table, ready before any static initializer could ask for it.
constexpr Kernels kScalar = [] {
  Kernels k;
  k.level = SimdLevel::scalar;
  k.gemm_mr = kScalarMr;
  k.gemm_nr = kScalarNr;
  k.to_f32 = to_f32_scalar;
  k.dot = dot_scalar;
  k.axpy = axpy_scalar;
  k.scale = scale_scalar;
  k.sum_sq = sum_sq_scalar;
  k.mul_scaled = mul_scaled_scalar;
  k.dot_multi = dot_multi_scalar;
  k.axpy_multi = axpy_multi_scalar;
  k.gemv = gemv_scalar;
  k.gemm_pack = gemm_pack_scalar;
  k.gemm_micro = gemm_micro_scalar;
  k.qgemv = qgemv_scalar;
  k.qdequant = qdequant_scalar;
  return k;
}();

// CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c").
static bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

bool cpu_has(SimdLevel l) {
  // The CPU's features first: kernels_X() runs code of its level's translation unit (its static
  // table's initializer may use that level's instructions), so it is called only where they exist.
  switch (l) {
    case SimdLevel::scalar: return true;
    case SimdLevel::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c() && kernels_avx2();
    case SimdLevel::avx512:
      return cpu_has(SimdLevel::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && kernels_avx512();
    case SimdLevel::avx512vnni:
      return cpu_has(SimdLevel::avx512) && __builtin_cpu_supports("avx512vnni") && kernels_avx512vnni();
  }
  return false;
}

}  // namespace

const char* simd_level_name(SimdLevel l) {
  switch (l) {
    case SimdLevel::scalar: return "scalar";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::avx512: return "avx512";
    case SimdLevel::avx512vnni: return "avx512vnni";
  }
  return "?";
}

const Kernels* kernels_scalar() { return &kScalar; }
// Levels whose translation unit this build lacks (the compiler had no such flags).
#ifndef KILN_CPU_AVX2
const Kernels* kernels_avx2() { return nullptr; }
#endif
#ifndef KILN_CPU_AVX512
const Kernels* kernels_avx512() { return nullptr; }
#endif
#ifndef KILN_CPU_AVX512VNNI
const Kernels* kernels_avx512vnni() { return nullptr; }
#endif

SimdLevel best_simd_level() {
  if (cpu_has(SimdLevel::avx512vnni)) return SimdLevel::avx512vnni;
  if (cpu_has(SimdLevel::avx512)) return SimdLevel::avx512;
  if (cpu_has(SimdLevel::avx2)) return SimdLevel::avx2;
  return SimdLevel::scalar;
}

const Kernels& kernels_for(SimdLevel l) {
  if (!cpu_has(l))
    fail("cpu", "SIMD level {} is not available on this CPU or in this build (best: {})", simd_level_name(l),
         simd_level_name(best_simd_level()));
  switch (l) {
    case SimdLevel::avx512vnni: return *kernels_avx512vnni();
    case SimdLevel::avx512: return *kernels_avx512();
    case SimdLevel::avx2: return *kernels_avx2();
    default: return kScalar;
  }
}

SimdLevel simd_level_from_env() {
  const char* e = std::getenv("KILN_SIMD");
  if (!e || !*e) return best_simd_level();
  std::string v = e;
  for (SimdLevel l : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512, SimdLevel::avx512vnni}) {
    if (v != simd_level_name(l)) continue;
    if (!cpu_has(l))  // always true for scalar
      fail("cpu", "KILN_SIMD={} but this CPU or build lacks it (best here: {}); unset KILN_SIMD", v,
           simd_level_name(best_simd_level()));
    return l;
  }
  fail("cpu", "KILN_SIMD=\"{}\" is not one of scalar, avx2, avx512, avx512vnni", v);
}

}  // namespace kiln::backend::cpu
