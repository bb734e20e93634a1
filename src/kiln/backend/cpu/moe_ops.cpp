// CPU scatter_add_rows: the combine step of MoE layers (dst[rows[i]] += w[i] * src[i]).
// Sequential over i because rows repeat (a token picked by several experts); parallel over d.
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln::backend::cpu {

void CpuBackend::scatter_add_rows(const Tensor& src, const Tensor& rows, const Tensor& weights, Tensor& dst) {
  KILN_ASSERT(src.dtype == DType::f32 && dst.dtype == DType::f32 && weights.dtype == DType::f32 && rows.dtype == DType::i32);
  const int64_t m = src.rows(), d = src.cols(), n = dst.rows();
  KILN_ASSERT(dst.cols() == d && rows.numel() == m && weights.numel() == m, "scatter_add_rows shapes");
  const float* s = src.ptr<float>();
  const int32_t* r = rows.ptr<int32_t>();
  const float* w = weights.ptr<float>();
  float* o = dst.ptr<float>();
  for (int64_t i = 0; i < m; ++i) {
    KILN_ASSERT(r[i] >= 0 && r[i] < n, "scatter_add_rows row {} of {}", r[i], n);
    float* out = o + r[i] * d;
    const float* in = s + i * d;
    for (int64_t j = 0; j < d; ++j) out[j] += w[i] * in[j];
  }
}

}  // namespace kiln::backend::cpu
