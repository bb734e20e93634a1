// The quantized KV cache's per-group rule as host/device functions (kv_quant.h says what it is),
// without other includes so that CUDA kernels share it.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

namespace kiln::backend {

// One group of values in [w_min, w_max] at `bits`: scale = max((w_max - w_min) / (2^bits - 1), 1e-7),
// bias = w_min, both in f32; the caller rounds them to f16 (the stored form) before kv_code.
KILN_HD inline void kv_group_params(float w_min, float w_max, int bits, float* scale, float* bias) {
  *scale = fmaxf((w_max - w_min) / static_cast<float>((1 << bits) - 1), 1e-7f);
  *bias = w_min;
}
// q = clamp(round((w - bias) / scale), 0, 2^bits - 1) against the stored (f16-rounded) scale and bias.
KILN_HD inline uint32_t kv_code(float w, float scale, float bias, int bits) {
  const float v = roundf((w - bias) / scale);
  return static_cast<uint32_t>(fminf(fmaxf(v, 0.0f), static_cast<float>((1 << bits) - 1)));
}

}  // namespace kiln::backend
