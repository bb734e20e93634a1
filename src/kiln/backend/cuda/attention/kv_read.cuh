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

// The 32 / QB codes of one u32 word of QB-bit codes (mlx's LSB-first packing) as exact f32 in
// f[0, 32 / QB): a byte moved under the exponent of 2^23 (PRMT; bits 0x4B0000cc are 2^23 + cc), less
// 2^23 (FADD), two instructions a code where an I2F conversion would cost eight FMA slots; 4-bit
// words are first split into their even and odd nibbles' bytes.
template <int QB>
__device__ __forceinline__ void kv_code_floats(uint32_t w, float* f) {
  const auto byte = [](uint32_t x, int k) {
    return __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7440 + k)) - 8388608.0f;
  };
  if constexpr (QB == 8) {
#pragma unroll
    for (int k = 0; k < 4; ++k) f[k] = byte(w, k);
  } else {
    static_assert(QB == 4);
    const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;  // codes 2k and 2k + 1 in byte k
#pragma unroll
    for (int k = 0; k < 4; ++k) f[2 * k] = byte(lo, k), f[2 * k + 1] = byte(hi, k);
  }
}

}  // namespace kiln::backend::cuda
