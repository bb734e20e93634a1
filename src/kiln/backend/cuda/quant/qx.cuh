// The 4-bit GEMV's activation quantization (qmatmul.cu states the format; QxLayout in kernels.h),
// shared by its own quantize kernel and by the producer kernels that write qx beside their bf16
// output (rms_norm, add_rms_norm, gated_act), so every path stores the same bits.
#pragma once
#include "kiln/backend/cuda/core/common.cuh"

namespace kiln::backend::cuda {

// The qx of V (4 or 8) consecutive values f (bf16-exact) at columns col.. of a row (col % V == 0;
// zeros past the row): their codes (hi[i], lo[i]: 4 bytes each of columns 4i..4i+3) and their
// group's (d, S) (every lane of the group gets them). Called by every lane of a warp at once, the
// GS / V lanes of a group adjacent (their max and sum by shuffles, in a fixed order: the same sum
// for either V, so both store the same bits).
template <int GS, int V>
__device__ __forceinline__ void qx_encode(const float (&f)[V], uint32_t (&hi)[V / 4], uint32_t (&lo)[V / 4],
                                          float2& dS) {
  static_assert(V == 4 || V == 8, "4 or 8 values a lane");
  float amax = 0.0f, part[V / 4];
#pragma unroll
  for (int i = 0; i < V / 4; ++i) {
    const float* q = f + 4 * i;
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(q[0]), fabsf(q[1])), fmaxf(fabsf(q[2]), fabsf(q[3]))));
    part[i] = (q[0] + q[1]) + (q[2] + q[3]);
  }
  float sum = part[0];
  if constexpr (V == 8) sum += part[1];  // what the 4-value form's first shuffle step adds
#pragma unroll
  for (int o = 1; o < GS / V; o <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  // Rounding by adding kMagic = 1.5 * 2^23: the sum's last bit is worth 1, so it is the rounded
  // integer, held two's complement in the word's low bits (kMagic's low 22 bits are zero). Full-rate
  // FMAs instead of float <-> int conversions (a quarter of the rate) and an approximate reciprocal
  // instead of a division: ~2x fewer instructions, which the decoder stack's qx reads of h were bound
  // by (BENCHMARKS.md, seventeenth session). Every path encodes with this function, so all store the
  // same bits.
  constexpr float kRange = 127.0f * 254.0f, kMagic = 12582912.0f;
  const float inv = amax > 0.0f ? __fdividef(kRange, amax) : 0.0f;  // |f inv| <= kRange (1 + 2^-21)
  // The low bytes of four words, in order.
  auto low_bytes = [](const uint32_t(&w)[4]) {
    return __byte_perm(__byte_perm(w[0], w[1], 0x0040), __byte_perm(w[2], w[3], 0x0040), 0x5410);
  };
#pragma unroll
  for (int i = 0; i < V / 4; ++i) {
    uint32_t hb[4], lb[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float tv = fmaf(f[4 * i + e], inv, kMagic);            // kMagic + v, v = round(f inv)
      const float th = fmaf(tv - kMagic, 1.0f / 254.0f, kMagic);  // kMagic + h, h = round(v / 254) <= 127
      hb[e] = __float_as_uint(th);
      lb[e] = __float_as_uint(tv) - 254u * __float_as_uint(th);  // low byte: v - 254 h = l, |l| <= 127
    }
    hi[i] = low_bytes(hb), lo[i] = low_bytes(lb);
  }
  dS = make_float2(amax * (1.0f / kRange), sum);
}

// Where the codes of columns c32..c32+3 of a unit (c32 = col % 32) go in its 16 words: hi at
// [4t + half], lo at [4t + 2 + half].
__device__ __forceinline__ void qx_put_codes(uint32_t* unit, int c32, uint32_t hi, uint32_t lo) {
  const int j = c32 / 4, t = j & 3, half = j >> 2;  // columns 4j.. = 16 half + 4t..
  unit[4 * t + half] = hi;
  unit[4 * t + 2 + half] = lo;
}

// qx_encode of 4 values, stored at token tok of the layout L.
template <int GS>
__device__ __forceinline__ void qx_store4(const float (&f)[4], int64_t tok, int64_t col, const QxLayout& L,
                                          uint32_t* __restrict__ codes, float2* __restrict__ meta) {
  uint32_t hi[1], lo[1];
  float2 dS;
  qx_encode<GS>(f, hi, lo, dS);
  qx_put_codes(codes + (tok * L.units + col / 32) * 16, static_cast<int>(col % 32), hi[0], lo[0]);
  if (col % GS == 0) meta[((tok >> 3) * L.groups + col / GS) * 8 + (tok & 7)] = dS;
}

// 4 bf16 (the 8 bytes v, or at p) as floats.
__device__ __forceinline__ void bf16x4_to_f(uint2 v, float (&f)[4]) {
  f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
}
// 8 bf16 (the 16 bytes v) as floats.
__device__ __forceinline__ void bf16x8_to_f(uint4 v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void load_bf16x4(const __nv_bfloat16* p, float (&f)[4]) {
  bf16x4_to_f(*reinterpret_cast<const uint2*>(p), f);
}

// Every thread of a block: row tok of a bf16 output y [., in] (this block's writes to it made
// visible by a __syncthreads before) into qx, 4-value slots strided over the block (blockDim a
// multiple of 32, so a warp's lanes are all in or all out of a round).
template <int GS>
__device__ void qx_store_row(const __nv_bfloat16* yrow, int64_t in, int64_t tok, const QxOut& q) {
  auto* codes = static_cast<uint32_t*>(q.base);
  auto* meta = reinterpret_cast<float2*>(static_cast<char*>(q.base) + q.L.code_bytes);
  for (int64_t slot = threadIdx.x; slot < q.L.units * 8; slot += blockDim.x) {
    const int64_t col = slot * 4;
    float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (col < in) load_bf16x4(yrow + col, f);
    qx_store4<GS>(f, tok, col, q.L, codes, meta);
  }
}

// qx_store_row for the runtime group size.
__device__ __forceinline__ void qx_store_row_gs(const __nv_bfloat16* yrow, int64_t in, int64_t tok, const QxOut& q) {
  switch (q.group_size) {
    case 32: qx_store_row<32>(yrow, in, tok, q); break;
    case 64: qx_store_row<64>(yrow, in, tok, q); break;
    default: qx_store_row<128>(yrow, in, tok, q); break;
  }
}

}  // namespace kiln::backend::cuda
