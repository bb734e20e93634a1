// The avx512vnni level's GEMV for 2, 3, 5 and 6 bits (kernels_vnni.h): AVX-512 VBMI spreads each
// block's codes to a byte each (VPERMB, VPMULTISHIFTQB). Compiled with the VNNI flags plus
// -mavx512vbmi; used only when the CPU reports avx512vbmi (Ice Lake and later; Cascade Lake has VNNI
// without it).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kiln/backend/cpu/kernels_vnni.h"

namespace kiln::backend::cpu {

bool qgemv_vbmi(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                int64_t r1, float* y, int64_t y_stride) {
  static const bool cpu_has = __builtin_cpu_supports("avx512vbmi");
  if (!cpu_has) return false;
  switch (w.bits) {
    case 2: qgemv_bits<2>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); return true;
    case 3: qgemv_bits<3>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); return true;
    case 5: qgemv_bits<5>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); return true;
    case 6: qgemv_bits<6>(x, n_x, x_stride, xsum, w, r0, r1, y, y_stride); return true;
    default: return false;
  }
}

}  // namespace kiln::backend::cpu
