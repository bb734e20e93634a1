// The 4-bit tensor-core GEMV's arithmetic over one quad (qmatmul.cu states the tiled layout and the
// qx format), shared by the GEMV (qmatmul.cu) and the decoder stack (qdecoder.cu): one arithmetic per
// quad for both (they differ only in how a tile's quads are split over warps and summed).
#pragma once
#include <type_traits>

#include "kiln/backend/cuda/core/common.cuh"

namespace kiln::backend::cuda {

__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The (scale, bias) pair gi of a row's quad, from the raw words of its GPQ pairs.
template <typename ST>
__device__ __forceinline__ float2 pair_at(const uint32_t* w, int gi) {
  if constexpr (sizeof(ST) == 4) {
    return make_float2(__uint_as_float(w[2 * gi]), __uint_as_float(w[2 * gi + 1]));
  } else if constexpr (std::is_same_v<ST, __nv_bfloat16>) {
    return make_float2(__uint_as_float(w[gi] << 16), __uint_as_float(w[gi] & 0xffff0000u));
  } else {
    const __half2 h = *reinterpret_cast<const __half2*>(&w[gi]);
    return __half22float2(h);
  }
}

// Pair words per row and quad.
template <typename ST, int GS>
constexpr int q4_pair_words() {
  return (128 / GS) * (sizeof(ST) == 4 ? 2 : 1);
}

// The A fragments of one unit (rows g, g + 8: the lane's code words lo, hi in the tiled nibble order).
__device__ __forceinline__ void q4_unit_a(uint32_t lo, uint32_t hi, uint32_t (&a)[4]) {
  constexpr uint32_t kLow = 0x0F0F0F0Fu;
  a[0] = lo & kLow, a[1] = hi & kLow, a[2] = (lo >> 4) & kLow, a[3] = (hi >> 4) & kLow;
}

// One quad of a tile for one warp (lane = 4g + t): acc (C layout: rows g, g + 8 x tokens 2t, 2t + 1)
// += the quad's 4 units. wl / wh: the lane's code words of rows g / g + 8 (the tiled uint4s h = 0, 1);
// pl / ph: the pair words of rows g / g + 8; xv: the lane's B fragments of units 0..3 (zeros for
// tokens past the pass); dm(gi) -> (d, S) of tokens 2t and 2t + 1 for the quad's group gi; two: token
// 2t + 1 exists for some lane (else acc[1], acc[3] are left alone).
template <typename ST, int GS, typename Meta>
__device__ __forceinline__ void q4_quad_mma(float (&acc)[4], const uint4& wl, const uint4& wh, const uint32_t* pl,
                                            const uint32_t* ph, const uint4 (&xv)[4], Meta dm_of, bool two) {
  constexpr int GPQ = 128 / GS, UPG = GS / 32;  // groups per quad, units per group
  const uint32_t lo[4] = {wl.x, wl.y, wl.z, wl.w}, hi[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
  for (int gi = 0; gi < GPQ; ++gi) {
    int ch[4] = {0, 0, 0, 0}, cl[4] = {0, 0, 0, 0};
#pragma unroll
    for (int jj = 0; jj < UPG; ++jj) {
      const int u = gi * UPG + jj;
      uint32_t a[4];
      q4_unit_a(lo[u], hi[u], a);
      mma_u8s8(ch, a[0], a[1], a[2], a[3], xv[u].x, xv[u].y);
      mma_u8s8(cl, a[0], a[1], a[2], a[3], xv[u].z, xv[u].w);
    }
    const float4 dm = dm_of(gi);  // (d, S) token 2t, (d, S) token 2t + 1
    const float2 sl = pair_at<ST>(pl, gi), sh = pair_at<ST>(ph, gi);
    acc[0] = fmaf(sl.x * dm.x, static_cast<float>(254 * ch[0] + cl[0]), fmaf(sl.y, dm.y, acc[0]));
    acc[2] = fmaf(sh.x * dm.x, static_cast<float>(254 * ch[2] + cl[2]), fmaf(sh.y, dm.y, acc[2]));
    if (two) {  // token 2t + 1 (column 1 of lane t = 0 is past the only token otherwise)
      acc[1] = fmaf(sl.x * dm.z, static_cast<float>(254 * ch[1] + cl[1]), fmaf(sl.y, dm.w, acc[1]));
      acc[3] = fmaf(sh.x * dm.z, static_cast<float>(254 * ch[3] + cl[3]), fmaf(sh.y, dm.w, acc[3]));
    }
  }
}

// q4_quad_mma for at most 4 tokens with one MMA per unit instead of two: B column 2j holds token
// j's hi codes and column 2j + 1 its lo codes, so lane t's C columns (2t, 2t + 1) are token t's two
// sums (the same integers, so the same bits). acc: rows g, g + 8 of token t; xv: the lane's B
// fragment of each unit (lanes g < 2 * tokens: words 4t + 2 (g & 1), +1 of token g / 2's unit);
// dm_of(gi) -> (d, S) of token t.
template <typename ST, int GS, typename Meta>
__device__ __forceinline__ void q4_quad_mma_packed(float (&acc)[2], const uint4& wl, const uint4& wh,
                                                   const uint32_t* pl, const uint32_t* ph, const uint2 (&xv)[4],
                                                   Meta dm_of) {
  constexpr int GPQ = 128 / GS, UPG = GS / 32;
  const uint32_t lo[4] = {wl.x, wl.y, wl.z, wl.w}, hi[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
  for (int gi = 0; gi < GPQ; ++gi) {
    int c[4] = {0, 0, 0, 0};
#pragma unroll
    for (int jj = 0; jj < UPG; ++jj) {
      const int u = gi * UPG + jj;
      uint32_t a[4];
      q4_unit_a(lo[u], hi[u], a);
      mma_u8s8(c, a[0], a[1], a[2], a[3], xv[u].x, xv[u].y);
    }
    const float2 dm = dm_of(gi);
    const float2 sl = pair_at<ST>(pl, gi), sh = pair_at<ST>(ph, gi);
    acc[0] = fmaf(sl.x * dm.x, static_cast<float>(254 * c[0] + c[1]), fmaf(sl.y, dm.y, acc[0]));
    acc[1] = fmaf(sh.x * dm.x, static_cast<float>(254 * c[2] + c[3]), fmaf(sh.y, dm.y, acc[1]));
  }
}

}  // namespace kiln::backend::cuda
