// Scalar quantized kernels: the plain statement of what the SIMD levels compute (Kernels::qgemv,
// Kernels::qdequant in kernels.h), one code at a time from the LSB-first bit stream.
#include <cstring>

#include "kiln/backend/cpu/kernels.h"

namespace kiln::backend::cpu {

// kernels_scalar.cpp: element i of an f32, bf16 or f16 array.
float load_scalar(const void* p, DType t, int64_t i);

namespace {

// Code k of a row: bits [k * bits, (k + 1) * bits) of the stream, read byte by byte so nothing past
// the row's last byte is touched.
inline uint32_t code_at(const uint8_t* row, int64_t k, int bits) {
  const int64_t bit = k * bits;
  const uint8_t* b = row + bit / 8;
  const int sh = static_cast<int>(bit % 8);
  uint32_t v = b[0];
  if (sh + bits > 8) v |= static_cast<uint32_t>(b[1]) << 8;
  return (v >> sh) & ((1u << bits) - 1);
}

}  // namespace

void qgemv_scalar(const float* x, int64_t n_x, int64_t x_stride, const float* xsum, const QMatrix& w, int64_t r0,
                  int64_t r1, float* y, int64_t y_stride) {
  const int64_t gs = w.group_size, n_groups = w.n_groups();
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.w + r * w.row_bytes;
    for (int64_t t = 0; t < n_x; ++t) {
      const float* xt = x + t * x_stride;
      float acc = 0.0f;
      for (int64_t g = 0; g < n_groups; ++g) {
        float part = 0.0f;
        for (int64_t k = g * gs; k < (g + 1) * gs; ++k) part += xt[k] * static_cast<float>(code_at(row, k, w.bits));
        acc += load_scalar(w.scales, w.sdt, r * n_groups + g) * part +
               load_scalar(w.biases, w.sdt, r * n_groups + g) * xsum[t * n_groups + g];
      }
      y[t * y_stride + r] = acc;
    }
  }
}

void qdequant_scalar(const QMatrix& w, int64_t r, int64_t k0, int64_t kc, float* dst) {
  const uint8_t* row = w.w + r * w.row_bytes;
  const int64_t n_groups = w.n_groups();
  for (int64_t k = 0; k < kc; ++k) {
    const int64_t g = (k0 + k) / w.group_size;
    dst[k] = load_scalar(w.scales, w.sdt, r * n_groups + g) * static_cast<float>(code_at(row, k0 + k, w.bits)) +
             load_scalar(w.biases, w.sdt, r * n_groups + g);
  }
}

}  // namespace kiln::backend::cpu
