// Default implementations of Backend ops that any backend can express through its buffers or its
// other ops: a reference a backend overrides when it has a faster path (the CUDA backend does).
// The fused ops' defaults are exactly the sequences of ops they replace (the CPU runs these).
#include <algorithm>
#include <vector>

#include "kiln/backend/backend.h"

namespace kiln::backend {

void Backend::argmax_rows(const Tensor& x, Tensor& ids) {
  if (ids.dtype != DType::i32 || ids.numel() != x.rows())
    fail(name(), "argmax_rows: ids must be int32 [{}], got {} {}", x.rows(), dtype_name(ids.dtype), shape_str(ids.shape));
  Tensor h = to_host(x);
  const int64_t rows = x.rows(), n = x.cols();
  std::vector<float> row(n);
  Tensor out = Tensor::host(DType::i32, {rows});
  for (int64_t r = 0; r < rows; ++r) {
    to_f32(static_cast<const char*>(h.data) + r * n * dtype_size(h.dtype), h.dtype, row.data(), n);
    out.ptr<int32_t>()[r] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  }
  Tensor d = upload(out);
  copy(d, ids);
}

void Backend::add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, bool one_plus_w, Tensor& y) {
  if (delta.numel() != x.numel() || y.numel() != x.numel())
    fail(name(), "add_rms_norm: x {} delta {} y {} must have the same size", shape_str(x.shape),
         shape_str(delta.shape), shape_str(y.shape));
  add(x, delta, x);
  rms_norm(x, w, eps, one_plus_w, y);
}

void Backend::rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& inv_freq,
                            float attn_factor, const Tensor& slots, Tensor& k_cache, Tensor& v_cache) {
  if (q.ndim() != 3 || k.ndim() != 3 || q.dim(0) != k.dim(0))
    fail(name(), "rope_kv_write: q {} and k {} must be [n_tokens, heads, head_dim] of the same n_tokens",
         shape_str(q.shape), shape_str(k.shape));
  rope(q, pos, inv_freq, attn_factor);
  rope(k, pos, inv_freq, attn_factor);
  const Tensor k2 = k.view({k.dim(0), k.dim(1) * k.dim(2)});  // [n_tokens, n_kv_heads * head_dim]
  kv_write(k2, v, slots, k_cache, v_cache);
}

void Backend::matmul_multi(const Tensor& x, std::span<const Weight* const> w, std::span<Tensor* const> y) {
  if (w.size() != y.size() || w.size() > kMaxMultiMatmul)
    fail(name(), "matmul_multi: {} weights for {} outputs (at most {} pairs)", w.size(), y.size(), kMaxMultiMatmul);
  for (size_t i = 0; i < w.size(); ++i) matmul(x, *w[i], *y[i]);
}

}  // namespace kiln::backend
