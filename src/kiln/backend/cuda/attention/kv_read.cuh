// Reading a KV cache row element in f32 inside the attention kernels, from a bf16 cache or a
// quantized one (KvTensor, backend.h): value = code * scale + bias of the element's group, the
// f32 arithmetic of the CPU's dequantize_kv_row. Element e = slot * kv_width + kv_head * head_dim + d.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kiln::backend::cuda {

__device__ __forceinline__ float kv_value(const void* data, const void* scales, const void* biases, int bits, int group,
                                          int64_t e) {
  if (bits == 0) return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[e]);
  const uint8_t* c = static_cast<const uint8_t*>(data);
  const uint32_t code = bits == 8 ? c[e] : (c[e >> 1] >> ((e & 1) * 4)) & 15u;
  const int64_t g = e / group;
  return fmaf(static_cast<float>(code), __half2float(static_cast<const __half*>(scales)[g]),
              __half2float(static_cast<const __half*>(biases)[g]));
}

// Eight consecutive values from element e (a multiple of 8, inside one group) of a quantized cache
// at BITS (8 or 4), as eight f32: one 8- or 4-byte load of codes plus the group's scale and bias.
template <int BITS>
__device__ __forceinline__ void kv_dequant8(const void* data, const void* scales, const void* biases, int group,
                                            int64_t e, float (&f)[8]) {
  const int64_t g = e / group;
  const float s = __half2float(static_cast<const __half*>(scales)[g]), b = __half2float(static_cast<const __half*>(biases)[g]);
  if constexpr (BITS == 8) {
    const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(data) + e);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[i] = fmaf(static_cast<float>((w.x >> (8 * i)) & 255u), s, b);
      f[4 + i] = fmaf(static_cast<float>((w.y >> (8 * i)) & 255u), s, b);
    }
  } else {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(data) + e / 2);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = fmaf(static_cast<float>((w >> (4 * i)) & 15u), s, b);
  }
}

}  // namespace kiln::backend::cuda
