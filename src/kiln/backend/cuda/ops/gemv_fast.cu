// Batch-1 bf16 GEMV tuned for bytes in flight: y [1, out] = x [1, in] · w [out, in]ᵀ (+ bias).
// One warp per output row, 4-warp blocks (k/v-sized outputs still spread over every SM); each lane
// issues up to kLoads 16-byte weight loads (ld.global.nc.L1::no_allocate: streamed once, so they do
// not evict x from L1) before the first use, so an in = 4096 row is requested whole in one round.
// x (bf16, tiny) is read through L1. f32 accumulation, warp-shuffle reduction, one rounding on store.
// launch_gemv_fast_multi runs the same row body over up to 4 matrices sharing x in one launch.
// Taken for every batch-1 bf16 GEMV it supports (82% against gemv.cu's 61% of the copy rate over a
// llama-3-8b decode step's projections: 168 against 135 tok/s, docs/perf-log.md); gemv.cu keeps the
// other cases (several tokens, other dtypes, unaligned rows).
#include <cstdint>

#include "kiln/backend/cuda/core/common.cuh"

namespace kiln::backend::cuda {

namespace {

constexpr int kFastWarps = 4;  // warps (rows) per block
constexpr int kLoads = 16;     // 16-byte weight loads per lane per round (256 B in flight per lane)

// Σ of the 8 products of two bf16x8 vectors (bf16 is the high half of an f32), into acc.
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
  const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(aw[i] << 16), __uint_as_float(bw[i] << 16), acc);
    acc = fmaf(__uint_as_float(aw[i] & 0xffff0000u), __uint_as_float(bw[i] & 0xffff0000u), acc);
  }
  return acc;
}

__device__ __forceinline__ float load_bias(const void* p, Dt t, int64_t i) {
  switch (t) {
    case Dt::f32: return static_cast<const float*>(p)[i];
    case Dt::bf16: return to_f(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return to_f(static_cast<const __half*>(p)[i]);
  }
}

// The body of both kernels: this warp's row r of y = x · wᵀ (+ bias). Needs in % 8 == 0 and
// 16-byte aligned w, x.
__device__ __forceinline__ void gemv_fast_row(const __nv_bfloat16* __restrict__ x, int64_t in,
                                              const __nv_bfloat16* __restrict__ w, int64_t r, const void* bias, Dt bt,
                                              void* y, Dt yt) {
  const int lane = threadIdx.x & 31;
  const int64_t nvec = in / 8;  // 16-byte vectors per row
  const uint4* wr = reinterpret_cast<const uint4*>(w + r * in);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float acc0 = 0.0f, acc1 = 0.0f;  // two chains: half the FMA dependency depth
  // Whole rounds (warp-uniform bound): unconditional loads, all issued before the first use.
  int64_t b = 0;
  for (; b + 32 * kLoads <= nvec; b += 32 * kLoads) {
    uint4 wv[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) wv[u] = ld_stream(wr + b + lane + 32 * u);
    pdl_wait();  // x is the previous kernel's output (the weights above are not)
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const uint4 xv = __ldg(xr + b + lane + 32 * u);
      if (u & 1) acc1 = dot8(wv[u], xv, acc1);
      else acc0 = dot8(wv[u], xv, acc0);
    }
  }
  if (b < nvec) {  // the tail: fewer than 32 * kLoads vectors, missing ones read as zeros
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    uint4 wv[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t v = b + lane + 32 * u;
      wv[u] = v < nvec ? ld_stream(wr + v) : zero;
    }
    pdl_wait();
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t v = b + lane + 32 * u;
      const uint4 xv = v < nvec ? __ldg(xr + v) : zero;
      if (u & 1) acc1 = dot8(wv[u], xv, acc1);
      else acc0 = dot8(wv[u], xv, acc0);
    }
  }
  const float acc = warp_sum(acc0 + acc1);
  if (lane == 0) {
    const float v = acc + (bias ? load_bias(bias, bt, r) : 0.0f);
    switch (yt) {
      case Dt::f32: static_cast<float*>(y)[r] = v; break;
      case Dt::bf16: static_cast<__nv_bfloat16*>(y)[r] = __float2bfloat16_rn(v); break;
      default: static_cast<__half*>(y)[r] = __float2half_rn(v); break;
    }
  }
}

// grid ceil(out / kFastWarps); block kFastWarps * 32; one warp per row.
__global__ void __launch_bounds__(kFastWarps * 32) gemv_bf16_fast_kernel(const __nv_bfloat16* __restrict__ x,
                                                                         int64_t in,
                                                                         const __nv_bfloat16* __restrict__ w,
                                                                         int64_t out, const void* bias, Dt bt,
                                                                         void* y, Dt yt) {
  pdl_trigger();
  const int64_t r = int64_t{blockIdx.x} * kFastWarps + (threadIdx.x >> 5);
  if (r >= out) return;  // warp-uniform
  gemv_fast_row(x, in, w, r, bias, bt, y, yt);
}

// The multi-matrix form: matrix i owns blocks [block_start[i], block_start[i + 1]), each of
// kFastWarps rows of it, so a block never straddles two matrices and every warp's work is the
// single kernel's. The arguments travel by value (kernel parameter space).
struct MultiArgs {
  GemvFastMulti m;
  unsigned block_start[GemvFastMulti::kMax + 1];
};

__global__ void __launch_bounds__(kFastWarps * 32) gemv_bf16_fast_multi_kernel(const __nv_bfloat16* __restrict__ x,
                                                                               int64_t in, const MultiArgs a) {
  pdl_trigger();
  int i = 0;
  while (i + 1 < a.m.count && blockIdx.x >= a.block_start[i + 1]) ++i;
  const int64_t r = int64_t{blockIdx.x - a.block_start[i]} * kFastWarps + (threadIdx.x >> 5);
  if (r >= a.m.out[i]) return;  // warp-uniform
  gemv_fast_row(x, in, static_cast<const __nv_bfloat16*>(a.m.w[i]), r, a.m.bias[i], a.m.bias_t[i], a.m.y[i],
                a.m.y_t[i]);
}

}  // namespace

bool gemv_fast_supported(Dt xt, int64_t n, int64_t in, const void* w, Dt wt, const void* x) {
  return xt == Dt::bf16 && wt == Dt::bf16 && n == 1 && in % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

void launch_gemv_fast(const void* x, int64_t in, const void* w, int64_t out, const void* bias, Dt bt, void* y, Dt yt,
                      cudaStream_t s) {
  if (out == 0) return;
  const unsigned grid = static_cast<unsigned>((out + kFastWarps - 1) / kFastWarps);
  launch_pdl(gemv_bf16_fast_kernel, grid, kFastWarps * 32, 0, s, static_cast<const __nv_bfloat16*>(x), in,
             static_cast<const __nv_bfloat16*>(w), out, bias, bt, y, yt);
  KILN_CUDA_LAUNCH_CHECK("gemv_fast");
}

void launch_gemv_fast_multi(const void* x, int64_t in, const GemvFastMulti& m, cudaStream_t s) {
  MultiArgs a{m, {}};
  unsigned blocks = 0;
  for (int i = 0; i < m.count; ++i) {
    a.block_start[i] = blocks;
    blocks += static_cast<unsigned>((m.out[i] + kFastWarps - 1) / kFastWarps);
  }
  a.block_start[m.count] = blocks;
  if (blocks == 0) return;
  launch_pdl(gemv_bf16_fast_multi_kernel, blocks, kFastWarps * 32, 0, s, static_cast<const __nv_bfloat16*>(x), in, a);
  KILN_CUDA_LAUNCH_CHECK("gemv_fast_multi");
}

}  // namespace kiln::backend::cuda
