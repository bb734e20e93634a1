// Weight-streaming GEMV for decode-sized batches: y [n, out] = x [n, in] · w [out, in]ᵀ (+ bias).
// Memory-bound: each weight element is read once per pass of up to 8 tokens. One warp per output
// row; each lane issues UNROLL independent 16-byte weight loads before using them (bytes in flight
// hide DRAM latency); x rows are tiny and stay in L1. f32 accumulation, a warp-shuffle reduction,
// one rounding on store. A scalar path covers rows that are not 16-byte aligned.
#include <cstdint>

#include "kiln/backend/cuda/core/common.cuh"

namespace kiln::backend::cuda {

namespace {

constexpr int kWarps = 8;   // warps (output rows) per block
constexpr int kUnroll = 4;  // 16-byte loads in flight per lane (8 measured slower: 109 vs 129 tok/s)

// grid (ceil(out / kWarps), ceil(n / NT)); block kWarps * 32. Tokens [NT * blockIdx.y, +NT) of x.
template <typename XT, typename WT, int NT, bool VECTOR>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const XT* __restrict__ x, int64_t n, int64_t in,
                                                           const WT* __restrict__ w, int64_t out, const void* bias,
                                                           Dt bt, void* y, Dt yt) {
  constexpr int VEC = 16 / sizeof(WT);
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  if (r >= out) return;
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = static_cast<int>(n - t0 < NT ? n - t0 : NT);
  const WT* wr = w + r * in;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;

  if constexpr (VECTOR) {
    constexpr int64_t step = 32 * VEC;
    for (int64_t k0 = lane * VEC; k0 < in; k0 += step * kUnroll) {
      float wv[kUnroll][VEC];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (k0 + u * step < in) load_vec<WT, VEC>(wr + k0 + u * step, wv[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = k0 + u * step;
        if (k >= in) break;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t >= nt) break;
          float xv[VEC];
          load_vec<XT, VEC>(x + (t0 + t) * in + k, xv);
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[t] = fmaf(wv[u][i], xv[i], acc[t]);
        }
      }
    }
  } else {
    for (int64_t k = lane; k < in; k += 32) {
      const float wv = to_f(wr[k]);
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < nt) acc[t] = fmaf(wv, to_f(x[(t0 + t) * in + k]), acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = warp_sum(acc[t]);
  if (lane == 0) {
    const float b = bias ? load_s(bias, bt, r) : 0.0f;
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < nt) store_s(y, yt, (t0 + t) * out + r, acc[t] + b);
  }
}

template <typename XT, typename WT, int NT>
void launch_nt(const void* x, int64_t n, int64_t in, const void* w, int64_t out, const void* bias, Dt bt, void* y,
               Dt yt, bool vector, cudaStream_t s) {
  dim3 grid(static_cast<unsigned>((out + kWarps - 1) / kWarps), static_cast<unsigned>((n + NT - 1) / NT));
  auto xp = static_cast<const XT*>(x);
  auto wp = static_cast<const WT*>(w);
  if (vector) gemv_kernel<XT, WT, NT, true><<<grid, kWarps * 32, 0, s>>>(xp, n, in, wp, out, bias, bt, y, yt);
  else gemv_kernel<XT, WT, NT, false><<<grid, kWarps * 32, 0, s>>>(xp, n, in, wp, out, bias, bt, y, yt);
}

}  // namespace

void launch_gemv(const void* x, Dt xt, int64_t n, int64_t in, const void* w, Dt wt, int64_t out, const void* bias,
                 Dt bt, void* y, Dt yt, cudaStream_t s) {
  if (n == 0 || out == 0) return;
  if (gemv_fast_supported(xt, n, in, w, wt, x))
    return launch_gemv_fast(x, in, w, out, bias, bt, y, yt, s);
  if (xt == Dt::f16) {
    std::fprintf(stderr, "[cuda] gemv: x must be bf16 or f32\n");
    std::abort();
  }
  dispatch(xt, [&]<typename XT>() {
    dispatch(wt, [&]<typename WT>() {
      if constexpr (!std::is_same_v<XT, __half>) {
        constexpr int vec = 16 / sizeof(WT);
        // Vector loads need every weight row and every x row to start on a VEC-element boundary.
        const bool vector = in % vec == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                            reinterpret_cast<uintptr_t>(x) % (vec * sizeof(XT)) == 0;
        if (n <= 1) launch_nt<XT, WT, 1>(x, n, in, w, out, bias, bt, y, yt, vector, s);
        else if (n <= 2) launch_nt<XT, WT, 2>(x, n, in, w, out, bias, bt, y, yt, vector, s);
        else if (n <= 4) launch_nt<XT, WT, 4>(x, n, in, w, out, bias, bt, y, yt, vector, s);
        else launch_nt<XT, WT, kGemvMaxTokens>(x, n, in, w, out, bias, bt, y, yt, vector, s);
      }
    });
  });
  KILN_CUDA_LAUNCH_CHECK("gemv");
}

}  // namespace kiln::backend::cuda
