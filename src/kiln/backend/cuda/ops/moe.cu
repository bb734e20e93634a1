// MoE on the device for decode-sized batches: the router (softmax + top-k per token) and the
// experts' gated MLPs, where every block reads its (token, slot)'s expert id from device memory and
// picks that expert's weight rows from a device table of pointers, so a step needs no host round
// trip and can be replayed as a CUDA graph. Values follow Backend::moe_route / moe_experts: f32
// math, and bf16 roundings where the default's gate/up/h/y tensors round.
#include <cfloat>
#include <cstdint>

#include "kiln/backend/cuda/core/common.cuh"

namespace kiln::backend::cuda {

namespace {

constexpr int kWarps = 8;   // warps (output rows) per block of the GEMV kernels
constexpr int kUnroll = 2;  // vector steps of weight loads issued before they are used

// ---- router: one warp per token; the row's logits (f32) and taken-flags in shared memory.
template <typename LT>
__global__ void moe_route_kernel(const LT* logits, int64_t n_experts, int top_k, bool norm, int32_t* ids,
                                 float* weights) {
  extern __shared__ float sh[];
  float* l = sh;                                                 // [E]
  unsigned char* taken = reinterpret_cast<unsigned char*>(sh + n_experts);  // [E]
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x;
  float mx = -INFINITY;
  for (int64_t e = lane; e < n_experts; e += 32) {
    const float v = to_f(logits[t * n_experts + e]);
    l[e] = v;
    taken[e] = 0;
    mx = fmaxf(mx, v);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int64_t e = lane; e < n_experts; e += 32) sum += expf(l[e] - mx);
  sum = warp_sum(sum);
  __syncwarp();
  float top_sum = 0.0f;
  for (int i = 0; i < top_k; ++i) {
    // Largest untaken logit (= largest probability), the lower index on ties: per lane over its
    // experts in increasing order, then a symmetric warp reduction (every lane gets the winner).
    float best = -INFINITY;
    int bi = -1;
    for (int64_t e = lane; e < n_experts; e += 32)
      if (!taken[e] && (bi < 0 || l[e] > best)) best = l[e], bi = static_cast<int>(e);
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && (bi < 0 || ob > best || (ob == best && oi < bi))) best = ob, bi = oi;
    }
    const float p = bi < 0 ? 0.0f : expf(best - mx) / sum;
    top_sum += p;
    if (lane == 0) {
      if (bi >= 0) taken[bi] = 1;
      ids[t * top_k + i] = bi;
      weights[t * top_k + i] = p;
    }
    __syncwarp();
  }
  if (norm && lane == 0)
    for (int i = 0; i < top_k; ++i) weights[t * top_k + i] /= top_sum;
}

// ---- experts

// acc[m] += Σ_i a[i] * w_m[i] over i < len, for NW weight rows sharing the input row a: lane-strided
// vector steps (VECTOR) or elements; the caller reduces over the warp.
template <typename AT, typename WT, int NW, bool VECTOR>
__device__ __forceinline__ void warp_dots(const AT* a, const WT* const (&w)[NW], int64_t len, float (&acc)[NW]) {
  const int lane = threadIdx.x & 31;
  if constexpr (VECTOR) {
    constexpr int VEC = 16 / sizeof(WT);
    constexpr int64_t step = 32 * VEC;
    for (int64_t k0 = lane * VEC; k0 < len; k0 += step * kUnroll) {
      float wv[kUnroll][NW][VEC];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (k0 + u * step < len) {
#pragma unroll
          for (int m = 0; m < NW; ++m) load_vec<WT, VEC>(w[m] + k0 + u * step, wv[u][m]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (k0 + u * step >= len) break;
        float av[VEC];
        load_vec<AT, VEC>(a + k0 + u * step, av);
#pragma unroll
        for (int m = 0; m < NW; ++m)
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[m] = fmaf(wv[u][m][i], av[i], acc[m]);
      }
    }
  } else {
    for (int64_t k = lane; k < len; k += 32) {
      const float av = to_f(a[k]);
#pragma unroll
      for (int m = 0; m < NW; ++m) acc[m] = fmaf(to_f(w[m][k]), av, acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < NW; ++m) acc[m] = warp_sum(acc[m]);
}

// The gated activation of launch_gated_act (elementwise.cu), the same expressions.
__device__ __forceinline__ float moe_act(float g, int act) {
  if (act == 0) return g / (1.0f + expf(-g));
  if (act == 1) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
}

// grid (ceil(ffn / kWarps), n * k); warp -> row r of ffn for pair p = blockIdx.y:
// h[p, r] = bf16(act(bf16(x[t]·gate_e[r])) * bf16(x[t]·up_e[r])).
template <typename XT, typename WT, bool VECTOR>
__global__ void __launch_bounds__(kWarps * 32) moe_gate_up_kernel(MoeExpertsArgs a) {
  const int64_t r = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int64_t p = blockIdx.y, t = p / a.k;
  if (r >= a.ffn) return;
  __nv_bfloat16* h = static_cast<__nv_bfloat16*>(a.h) + p * a.ffn;
  const int32_t e = a.ids[p];
  if (e < 0 || e >= a.n_experts) {  // no such expert: the pair adds nothing (combine skips it)
    if ((threadIdx.x & 31) == 0) h[r] = __float2bfloat16_rn(0.0f);
    return;
  }
  const WT* const w[2] = {static_cast<const WT*>(a.gate[e]) + r * a.dim, static_cast<const WT*>(a.up[e]) + r * a.dim};
  float acc[2] = {0.0f, 0.0f};
  warp_dots<XT, WT, 2, VECTOR>(static_cast<const XT*>(a.x) + t * a.dim, w, a.dim, acc);
  if ((threadIdx.x & 31) == 0) {
    const float g = __bfloat162float(__float2bfloat16_rn(acc[0]));
    const float u = __bfloat162float(__float2bfloat16_rn(acc[1]));
    h[r] = __float2bfloat16_rn(moe_act(g, a.act) * u);
  }
}

// grid (ceil(dim / kWarps), n * k); warp -> row r of dim: y[p, r] = bf16(h[p]·down_e[r]).
template <typename WT, bool VECTOR>
__global__ void __launch_bounds__(kWarps * 32) moe_down_kernel(MoeExpertsArgs a) {
  const int64_t r = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int64_t p = blockIdx.y;
  if (r >= a.dim) return;
  __nv_bfloat16* y = static_cast<__nv_bfloat16*>(a.y) + p * a.dim;
  const int32_t e = a.ids[p];
  if (e < 0 || e >= a.n_experts) {
    if ((threadIdx.x & 31) == 0) y[r] = __float2bfloat16_rn(0.0f);
    return;
  }
  const WT* const w[1] = {static_cast<const WT*>(a.down[e]) + r * a.ffn};
  float acc[1] = {0.0f};
  warp_dots<__nv_bfloat16, WT, 1, VECTOR>(static_cast<const __nv_bfloat16*>(a.h) + p * a.ffn, w, a.ffn, acc);
  if ((threadIdx.x & 31) == 0) y[r] = __float2bfloat16_rn(acc[0]);
}

// grid (ceil(dim / 128), n), 128 threads; shared: the token's k slots ordered by (expert, slot).
// out[t, d] accumulates weight * y over them from 0, rounded to OT at each add (scatter_add_rows).
template <typename OT>
__global__ void moe_combine_kernel(MoeExpertsArgs a) {
  extern __shared__ int order[];  // [k]
  const int64_t t = blockIdx.y;
  const int32_t* ids = a.ids + t * a.k;
  if (threadIdx.x == 0) {  // insertion sort of k (small) slots by (expert id, slot)
    for (int j = 0; j < a.k; ++j) {
      int i = j;
      while (i > 0 && ids[order[i - 1]] > ids[j]) order[i] = order[i - 1], --i;
      order[i] = j;
    }
  }
  __syncthreads();
  const int64_t d = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (d >= a.dim) return;
  const __nv_bfloat16* y = static_cast<const __nv_bfloat16*>(a.y);
  OT acc = from_f<OT>(0.0f);
  for (int i = 0; i < a.k; ++i) {
    const int64_t p = t * a.k + order[i];
    const int32_t e = a.ids[p];
    if (e < 0 || e >= a.n_experts) continue;
    acc = from_f<OT>(to_f(acc) + a.weights[p] * to_f(y[p * a.dim + d]));
  }
  static_cast<OT*>(a.out)[t * a.dim + d] = acc;
}

}  // namespace

void launch_moe_route(const void* logits, Dt lt, int64_t n, int64_t n_experts, int top_k, bool norm_topk_prob,
                      int32_t* ids, float* weights, cudaStream_t s) {
  if (n == 0) return;
  const size_t shmem = static_cast<size_t>(n_experts) * (sizeof(float) + 1);
  dispatch(lt, [&]<typename LT>() {
    moe_route_kernel<LT><<<static_cast<unsigned>(n), 32, shmem, s>>>(static_cast<const LT*>(logits), n_experts, top_k,
                                                                     norm_topk_prob, ids, weights);
  });
  KILN_CUDA_LAUNCH_CHECK("moe_route");
}

void launch_moe_experts(const MoeExpertsArgs& a, cudaStream_t s) {
  if (a.n == 0 || a.dim == 0) return;
  const unsigned pairs = static_cast<unsigned>(a.n * a.k);
  const dim3 gu_grid(static_cast<unsigned>((a.ffn + kWarps - 1) / kWarps), pairs);
  const dim3 down_grid(static_cast<unsigned>((a.dim + kWarps - 1) / kWarps), pairs);
  if (a.xt == Dt::f16) {
    std::fprintf(stderr, "[cuda] moe_experts: x must be bf16 or f32\n");
    std::abort();
  }
  dispatch(a.wt, [&]<typename WT>() {
    if (a.ffn > 0) {
      dispatch(a.xt, [&]<typename XT>() {
        if constexpr (!std::is_same_v<XT, __half>) {
          if (a.vector) moe_gate_up_kernel<XT, WT, true><<<gu_grid, kWarps * 32, 0, s>>>(a);
          else moe_gate_up_kernel<XT, WT, false><<<gu_grid, kWarps * 32, 0, s>>>(a);
        }
      });
      KILN_CUDA_LAUNCH_CHECK("moe_experts (gate/up)");
    }
    if (a.vector) moe_down_kernel<WT, true><<<down_grid, kWarps * 32, 0, s>>>(a);
    else moe_down_kernel<WT, false><<<down_grid, kWarps * 32, 0, s>>>(a);
    KILN_CUDA_LAUNCH_CHECK("moe_experts (down)");
  });
  const dim3 c_grid(static_cast<unsigned>((a.dim + 127) / 128), static_cast<unsigned>(a.n));
  dispatch(a.ot, [&]<typename OT>() {
    moe_combine_kernel<OT><<<c_grid, 128, static_cast<size_t>(a.k) * sizeof(int), s>>>(a);
  });
  KILN_CUDA_LAUNCH_CHECK("moe_experts (combine)");
}

}  // namespace kiln::backend::cuda
