// Batch-1 4-bit GEMV on the tensor cores with more bytes in flight than qmatmul.cu's
// qgemv4_mma_kernel: same MMA scheme (see the comment there: 16-row tiles, K split over 8 warps,
// permuted k order so a packed word becomes bf16x2 pairs (128 + q) with one and-or, a second MMA
// with A = 1 for Σx, per-group fold acc += scale·C1 + (bias − 128·scale)·C2), but x (one token) is
// staged once per block in shared memory instead of being loaded per unit into registers, which
// frees the registers for kUn = 16 units of weight words in flight per lane (2 rows x 16 x 4 B).
// Selected with KILN_CUDA_QGEMV=fast for one token and in <= kMaxIn (qgemv_fast_supported).
// Parity-tested; NOT the default: measured on the H200 (BENCHMARKS.md) it is no faster than qgemv4_mma_kernel (23% vs
// 22% of the copy rate over a decode step's projections; llama-3-8b 4-bit decode 149 vs 154 tok/s), so
// more bytes in flight alone do not fix the 4-bit GEMV; it stays for experiments.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kiln/backend/cuda/common.cuh"
#include "kiln/backend/cuda/qkernels.h"

namespace kiln::backend::cuda {

namespace {

constexpr int kWarps4 = 8;       // warps per block (K split)
constexpr int kUn = 16;          // units per lane per round
constexpr int64_t kMaxIn = 16384;  // x in shared memory: in * 2 bytes <= 32 KB

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pair(uint32_t w, int i) { return ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u; }

__device__ __forceinline__ float ld_s(const void* p, Dt t, int64_t i) {
  switch (t) {
    case Dt::f32: return __ldg(static_cast<const float*>(p) + i);
    case Dt::bf16: return to_f(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return to_f(static_cast<const __half*>(p)[i]);
  }
}
__device__ __forceinline__ void st_s(void* p, Dt t, int64_t i, float v) {
  switch (t) {
    case Dt::f32: static_cast<float*>(p)[i] = v; break;
    case Dt::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
  }
}

// grid ceil(out / 16); block kWarps4 * 32; dynamic shared memory in * 2 bytes (x).
__global__ void __launch_bounds__(kWarps4 * 32) qgemv4_fast_kernel(const __nv_bfloat16* __restrict__ x,
                                                                   QWeightArgs q, const void* bias, Dt bt, void* y,
                                                                   Dt yt) {
  extern __shared__ uint4 xs[];  // x as 16-byte vectors (in / 8 of them)
  __shared__ float red[kWarps4][16];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t tile = blockIdx.x;
  const int U = static_cast<int>(q.in / 32), n_groups = static_cast<int>(q.in / q.group_size);
  const int gshift = q.group_size == 32 ? 0 : (q.group_size == 64 ? 1 : 2);
  const int64_t row_lo = tile * 16 + g < q.out ? tile * 16 + g : q.out - 1;
  const int64_t row_hi = tile * 16 + g + 8 < q.out ? tile * 16 + g + 8 : q.out - 1;
  const int row_words = U * 4;
  const uint32_t* w_lo = q.w + row_lo * row_words + t;
  const uint32_t* w_hi = q.w + row_hi * row_words + t;
  const int u_begin = static_cast<int>(int64_t{warp} * U / kWarps4);
  const int u_end = static_cast<int>(int64_t{warp + 1} * U / kWarps4);

  // The first round's weight words are requested before x is staged (their latency overlaps it).
  uint32_t wl[kUn], wh[kUn];
#pragma unroll
  for (int k = 0; k < kUn; ++k) {
    const int u = u_begin + k < u_end ? u_begin + k : (u_end > u_begin ? u_end - 1 : u_begin);
    wl[k] = __ldg(w_lo + u * 4);
    wh[k] = __ldg(w_hi + u * 4);
  }
  for (int i = threadIdx.x; i < U * 4; i += kWarps4 * 32) xs[i] = __ldg(reinterpret_cast<const uint4*>(x) + i);
  __syncthreads();

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float c1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int cur_group = u_begin >> gshift;
  auto fold = [&](int grp) {
    const float s_lo = ld_s(q.scales, q.sdt, row_lo * n_groups + grp);
    const float b_lo = ld_s(q.biases, q.sdt, row_lo * n_groups + grp);
    const float s_hi = ld_s(q.scales, q.sdt, row_hi * n_groups + grp);
    const float b_hi = ld_s(q.biases, q.sdt, row_hi * n_groups + grp);
    // Only token 0 (C columns 0/1 in lane t = 0; column 0 is the real one) matters.
    acc[0] = fmaf(s_lo, c1[0], fmaf(b_lo - 128.0f * s_lo, c2[0], acc[0]));
    acc[2] = fmaf(s_hi, c1[2], fmaf(b_hi - 128.0f * s_hi, c2[2], acc[2]));
#pragma unroll
    for (int i = 0; i < 4; ++i) c1[i] = c2[i] = 0.0f;
  };
  constexpr uint32_t one2 = 0x3F803F80u;  // bf16x2 (1, 1)
  for (int u0 = u_begin; u0 < u_end; u0 += kUn) {
    if (u0 != u_begin) {
#pragma unroll
      for (int k = 0; k < kUn; ++k) {
        const int u = u0 + k < u_end ? u0 + k : u_end - 1;
        wl[k] = __ldg(w_lo + u * 4);
        wh[k] = __ldg(w_hi + u * 4);
      }
    }
#pragma unroll
    for (int k = 0; k < kUn; ++k) {
      const int u = u0 + k;
      if (u >= u_end) break;
      if ((u >> gshift) != cur_group) {
        fold(cur_group);
        cur_group = u >> gshift;
      }
      // B column g = token g: only token 0 exists, so lanes g != 0 feed zeros.
      const uint4 xv = g == 0 ? xs[u * 4 + t] : make_uint4(0u, 0u, 0u, 0u);
      const uint32_t b00 = __byte_perm(xv.x, xv.z, 0x5410), b01 = __byte_perm(xv.x, xv.z, 0x7632);
      const uint32_t b10 = __byte_perm(xv.y, xv.w, 0x5410), b11 = __byte_perm(xv.y, xv.w, 0x7632);
      mma16816(c1, pair(wl[k], 0), pair(wh[k], 0), pair(wl[k], 1), pair(wh[k], 1), b00, b01);
      mma16816(c1, pair(wl[k], 2), pair(wh[k], 2), pair(wl[k], 3), pair(wh[k], 3), b10, b11);
      mma16816(c2, one2, one2, one2, one2, b00, b01);
      mma16816(c2, one2, one2, one2, one2, b10, b11);
    }
  }
  if (u_begin < u_end) fold(cur_group);
  // C fragment: acc[0] = (row g, token 2t), acc[2] = (row g + 8, token 2t): token 0 lives in t = 0.
  if (t == 0) {
    red[warp][g] = acc[0];
    red[warp][g + 8] = acc[2];
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int64_t row = tile * 16 + threadIdx.x;
    if (row < q.out) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps4; ++w) v += red[w][threadIdx.x];
      if (bias) v += ld_s(bias, bt, row);
      st_s(y, yt, row, v);
    }
  }
}

}  // namespace

bool qgemv_fast_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CUDA_QGEMV");
    // Default off: enabled only once verified faster on the device (BENCHMARKS.md).
    return e && std::strcmp(e, "fast") == 0;
  }();
  return on;
}

bool qgemv_fast_supported(int64_t n, const QWeightArgs& w) {
  return n == 1 && w.bits == 4 && w.in <= kMaxIn && w.in % 32 == 0;
}

void launch_qgemv4_fast(const void* x, const QWeightArgs& w, const void* bias, Dt bt, void* y, Dt yt,
                        cudaStream_t s) {
  if (w.out == 0) return;
  const unsigned grid = static_cast<unsigned>((w.out + 15) / 16);
  const size_t smem = static_cast<size_t>(w.in) * 2;  // <= 32 KB: no opt-in attribute needed
  qgemv4_fast_kernel<<<grid, kWarps4 * 32, smem, s>>>(static_cast<const __nv_bfloat16*>(x), w, bias, bt, y, yt);
  KILN_CUDA_LAUNCH_CHECK("qgemv4_fast");
}

}  // namespace kiln::backend::cuda
