// Device helpers shared by the row kernels of elementwise.cu (rms_norm, rope) and their fused
// forms in fused.cu (add_rms_norm, rope_kv_write): one copy of the math, so that a fused kernel
// produces exactly the values of the separate kernels (same accumulation order, same roundings).
#pragma once
#include "kiln/backend/cuda/core/common.cuh"

namespace kiln::backend::cuda {

// Threads per block of the one-block-per-row kernels (at most kRowThreadsMax). The rms kernels must
// agree on it: the block's sum of squares depends on how the row is split over threads. A decode
// step's norm is one block on one SM, so its latency is the per-warp instruction count: wide rows
// get 512 threads (8 values each at 4096; with 256 threads the H200 spent ~6 µs in the one block).
constexpr int kRowThreadsMax = 512;
inline int row_threads(int64_t cols) { return cols >= 2048 ? 512 : cols >= 1024 ? 256 : cols >= 256 ? 128 : 64; }

// ss + v², the per-thread sum of squares (an explicit fma so that every kernel rounds alike).
__device__ __forceinline__ float sq_acc(float ss, float v) { return fmaf(v, v, ss); }

// The block-wide sum of every thread's `v` (blockDim.x a multiple of 32, at most 1024), in a fixed
// order: warp shuffles, then warp 0 over the warps' partials. Every thread gets the sum.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float p = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
    p = warp_sum(p);
    if (threadIdx.x == 0) part[0] = p;
  }
  __syncthreads();
  return part[0];
}

// Register-resident rows: a thread holds its elements d = threadIdx.x + k * blockDim.x, k < K, in
// registers (the strided order of the loop forms, so sums and roundings are the same), with every
// load of the row issued before the first use — one memory round trip instead of one per element
// (a 4096-wide add_rms_norm took ~13 µs as a loop on the H200). row_regs(cols): the K of a row,
// 0 (the loop form) past kRowRegMax elements per thread.
constexpr int kRowRegMax = 16;
inline int row_regs(int64_t cols) {
  const int64_t per = (cols + row_threads(cols) - 1) / row_threads(cols);
  return per <= 8 ? 8 : per <= kRowRegMax ? kRowRegMax : 0;
}
// Calls f.template operator()<K>() for K = row_regs(cols).
template <typename F>
void dispatch_row_regs(int64_t cols, F&& f) {
  switch (row_regs(cols)) {
    case 8: f.template operator()<8>(); break;
    case kRowRegMax: f.template operator()<kRowRegMax>(); break;
    default: f.template operator()<0>(); break;
  }
}

// The block's dynamic shared memory as a row of T (row_smem bytes at launch).
template <typename T>
__device__ __forceinline__ T* row_s() {
  extern __shared__ __align__(16) unsigned char row_smem_bytes[];
  return reinterpret_cast<T*>(row_smem_bytes);
}
// Dynamic shared memory of a register-resident row kernel (K > 0) that writes qx: its y row.
inline size_t row_smem(int64_t cols, size_t elem_bytes, bool qx) {
  return qx && row_regs(cols) > 0 ? static_cast<size_t>(cols) * elem_bytes : 0;
}

template <int K, typename T>
__device__ __forceinline__ void load_row(const T* p, int64_t dim, T (&v)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t d = threadIdx.x + int64_t{k} * blockDim.x;
    if (d < dim) v[k] = p[d];
  }
}

// rms_norm_store's math over the register-resident row v (weights wv); ys (if set): a copy of the
// row y in shared memory (what a block reads back for the row's qx without a global round trip).
template <int K, typename XT, typename WT, typename YT>
__device__ __forceinline__ void rms_norm_store_regs(const XT (&v)[K], const WT (&wv)[K], float ss, float eps,
                                                    bool one_plus, int64_t dim, YT* yr, YT* ys = nullptr) {
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t d = threadIdx.x + int64_t{k} * blockDim.x;
    if (d >= dim) break;
    float wf = to_f(wv[k]);
    if (one_plus) wf += 1.0f;
    const YT y = from_f<YT>((to_f(v[k]) * inv) * wf);
    yr[d] = y;
    if (ys) ys[d] = y;
  }
}

// y[d] = x[d] * rsqrt(ss / dim + eps) * (w[d] or 1 + w[d]) for this thread's d (threadIdx.x
// strided), ss the row's sum of squares. Each thread reads back only the x it accumulated, so y
// may alias x.
template <typename XT, typename WT, typename YT>
__device__ __forceinline__ void rms_norm_store(const XT* xr, const WT* w, float ss, float eps, bool one_plus,
                                               int64_t dim, YT* yr) {
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float wv = to_f(w[d]);
    if (one_plus) wv += 1.0f;
    yr[d] = from_f<YT>((to_f(xr[d]) * inv) * wv);
  }
}

// The rotate_half RoPE of the pair (v[i], v[i + half]) at position p: the angle p * inv_freq[i] is
// rounded to f32 as HF does; sincosf keeps full range reduction (no fast math), so large
// positions stay exact; cos/sin are scaled by attn_factor (yarn). Results rounded once to T.
template <typename T>
__device__ __forceinline__ void rope_pair(const T* v, int64_t i, int64_t half, float p, const float* inv_freq,
                                          float attn_factor, T& lo, T& hi) {
  float s, c;
  sincosf(p * inv_freq[i], &s, &c);
  c *= attn_factor;
  s *= attn_factor;
  const float a = to_f(v[i]), b = to_f(v[i + half]);
  lo = from_f<T>(fmaf(a, c, -(b * s)));
  hi = from_f<T>(fmaf(b, c, a * s));
}

}  // namespace kiln::backend::cuda
