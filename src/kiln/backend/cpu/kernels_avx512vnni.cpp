// AVX-512 VNNI: the AVX-512 table with the integer-dot-product GEMVs of kernels_vnni.h for 4 and
// 8 bits (2, 3, 5, 6 bits through kernels_avx512vbmi.cpp where the CPU has AVX-512 VBMI), compiled
// with the AVX-512 flags plus -mavx512vnni and selected at run time only when the CPU reports
// avx512_vnni.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kiln/backend/cpu/kernels_vnni.h"

namespace kiln::backend::cpu {
namespace {

void qgemv_vnni(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                int64_t r1, float* y, int64_t y_stride) {
  const int gs = w.group_size;
  if (gs == 32 || gs == 64 || gs == 128) {
    if (w.bits == 4) return qgemv_bits<4>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride);
    if (w.bits == 8) return qgemv_bits<8>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride);
    if (qgemv_vbmi(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride)) return;
  }
  kernels_avx512()->qgemv(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride);
}

}  // namespace

#ifndef KILN_CPU_AVX512VBMI
bool qgemv_vbmi(const float*, int64_t, int64_t, const float*, const QMatrix&, int64_t, int64_t, float*, int64_t) {
  return false;
}
#endif

const Kernels* kernels_avx512vnni() {
  static const Kernels k = [] {
    Kernels t = *kernels_avx512();
    t.level = SimdLevel::avx512vnni;
    t.qgemv = qgemv_vnni;
    return t;
  }();
  return &k;
}

}  // namespace kiln::backend::cpu
