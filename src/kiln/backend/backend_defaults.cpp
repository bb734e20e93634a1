// Default implementations of Backend ops that any backend can express through its buffers:
// a reference a backend overrides when it has a faster path (the CUDA backend does).
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

}  // namespace kiln::backend
