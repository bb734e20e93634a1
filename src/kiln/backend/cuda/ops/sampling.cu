// The device sampler: one thread block per row draws that row's token with the host Sampler's
// semantics (src/kiln/engine/sampler.cpp). Tokens are ranked by (logit desc, id asc) through a
// unique 64-bit key, so top-k, min-p and top-p each keep a prefix of that ranking and their
// cut-offs are found by radix selection (8 bits a pass over the row) instead of a sort.
// Probability mass is fixed point (2^40 = the top token's weight) summed in integers, so the
// same row and draw give the same token whatever the order threads run in.
#include <cfloat>
#include <cmath>

#include "kiln/backend/cuda/core/common.cuh"
#include "kiln/backend/cuda/ops/sampling.h"

namespace kiln::backend::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr double kOne = 1099511627776.0;  // 2^40: the fixed-point weight of probability ratio 1

using u64 = unsigned long long;

struct Smem {
  uint32_t count[256];  // radix histogram: tokens per bin
  u64 mass[256];        // radix histogram: weight per bin
  u64 red[kWarps];      // per-warp partials of reductions and scans
  float red_f[kWarps];
  int32_t red_i[kWarps];
  u64 target;           // broadcasts of thread 0's bin walk
  uint32_t need, bin, done;
  int64_t pick;
};

// Ranking key: larger key = ranked first. The float's bits made order-preserving as unsigned in
// the high half (-0 counts as +0, as they compare equal), ~id in the low half (lower id first).
__device__ __forceinline__ uint64_t rank_key(float l, int64_t j) {
  if (l == 0.0f) l = 0.0f;
  const uint32_t u = __float_as_uint(l);
  const uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(k) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(j));
}

// exp((l - m) / T) in fixed point; computed without FMA contraction, as the host does.
__device__ __forceinline__ float rel_prob(float l, float m, float inv_t) {
  return expf(__fmul_rn(__fsub_rn(l, m), inv_t));
}
__device__ __forceinline__ u64 fixed(float e) { return static_cast<u64>(static_cast<double>(e) * kOne); }

// Sum over the block; every thread gets it (same values summed in the same order: deterministic).
__device__ u64 block_sum(u64 v, Smem& sm) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // sm.red may still be read by a previous reduction
  if ((threadIdx.x & 31) == 0) sm.red[threadIdx.x >> 5] = v;
  __syncthreads();
  u64 t = 0;
  for (int w = 0; w < kWarps; ++w) t += sm.red[w];
  return t;
}

__device__ float block_max(float v, Smem& sm) {
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.red_f[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = sm.red_f[0];
  for (int w = 1; w < kWarps; ++w) t = fmaxf(t, sm.red_f[w]);
  return t;
}

// Inclusive prefix sum over the block in thread order; *total gets the block's sum.
__device__ u64 block_scan(u64 v, Smem& sm, u64* total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    u64 y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  __syncthreads();
  if (lane == 31) sm.red[w] = v;
  __syncthreads();
  u64 before = 0, t = 0;
  for (int i = 0; i < kWarps; ++i) {
    if (i < w) before += sm.red[i];
    t += sm.red[i];
  }
  *total = t;
  return before + v;
}

// The host's argmax: the first index of the largest value; NaN never wins, but a NaN at index 0
// (which nothing compares greater than) is returned, as is 0 when every value is NaN.
__device__ int32_t block_argmax(const float* x, int64_t n, Smem& sm) {
  float best = -INFINITY;
  int32_t bi = -1;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float v = x[j];
    if (!isnan(v) && (bi < 0 || v > best)) best = v, bi = static_cast<int32_t>(j);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t i2 = __shfl_xor_sync(0xffffffffu, bi, o);
    if (i2 >= 0 && (bi < 0 || v2 > best || (v2 == best && i2 < bi))) best = v2, bi = i2;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.red_f[threadIdx.x >> 5] = best, sm.red_i[threadIdx.x >> 5] = bi;
  __syncthreads();
  best = sm.red_f[0], bi = sm.red_i[0];
  for (int w = 1; w < kWarps; ++w) {
    const float v2 = sm.red_f[w];
    const int32_t i2 = sm.red_i[w];
    if (i2 >= 0 && (bi < 0 || v2 > best || (v2 == best && i2 < bi))) best = v2, bi = i2;
  }
  if (isnan(x[0]) || bi < 0) return 0;
  return bi;
}

// Radix selection over the ranking of the tokens with in_set(j) true. With weights off (count
// mode) it returns the key C such that exactly `need` of them have rank_key >= C; with weights
// on (mass mode) the key C of the first token, in rank order, at which their cumulative weight
// reaches `target` (the caller checks the set's weight reaches it). The bins are walked from the
// top; the search stops as soon as the chosen bin holds exactly what is needed.
template <bool kMass, typename InSet, typename Weight>
__device__ uint64_t radix_select(const float* x, int64_t n, InSet in_set, Weight weight, u64 need, Smem& sm) {
  uint64_t prefix = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sm.count[b] = 0, sm.mass[b] = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += kThreads) {
      const float l = x[j];
      if (!in_set(l, j)) continue;
      const uint64_t k = rank_key(l, j);
      if (shift < 56 && (k >> (shift + 8)) != prefix) continue;
      const int b = static_cast<int>((k >> shift) & 255);
      atomicAdd(&sm.count[b], 1u);
      if constexpr (kMass) atomicAdd(&sm.mass[b], weight(l));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      u64 cum = 0;
      int b = 255;
      for (; b > 0; --b) {
        const u64 have = kMass ? sm.mass[b] : sm.count[b];
        if (sm.count[b] > 0 && cum + have >= need) break;
        cum += have;
      }
      sm.target = need - cum;
      sm.bin = static_cast<uint32_t>(b);
      sm.done = kMass ? sm.count[b] == 1 : sm.count[b] == need - cum;
    }
    __syncthreads();
    need = sm.target;
    prefix = (prefix << 8) | sm.bin;
    if (sm.done) return prefix << shift;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t n, const DevSampleRow* rows,
                                                           int32_t* ids) {
  __shared__ Smem sm;
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * n;
  const DevSampleRow P = rows[blockIdx.x];
  if (!(P.temperature > 0.0f)) {  // greedy
    const int32_t a = block_argmax(x, n, sm);
    if (threadIdx.x == 0) ids[blockIdx.x] = a;
    return;
  }
  // Candidates: finite logits (the host also keeps +inf, whose softmax is NaN there: not copied).
  u64 cnt = 0;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float l = x[j];
    if (isfinite(l)) ++cnt, m = fmaxf(m, l);
  }
  cnt = block_sum(cnt, sm);
  m = block_max(m, sm);
  if (cnt == 0) {  // nothing to sample from: the host returns the argmax
    const int32_t a = block_argmax(x, n, sm);
    if (threadIdx.x == 0) ids[blockIdx.x] = a;
    return;
  }
  const float inv_t = 1.0f / P.temperature;
  auto w_of = [=](float l) { return fixed(rel_prob(l, m, inv_t)); };
  auto no_weight = [](float) { return u64{0}; };

  // top-k: the k best candidates (key >= ck).
  uint64_t ck = 0;
  if (P.top_k > 0 && static_cast<u64>(P.top_k) < cnt)
    ck = radix_select<false>(x, n, [](float l, int64_t) { return isfinite(l); }, no_weight,
                             static_cast<u64>(P.top_k), sm);
  // min-p: probability >= min_p x the top's, i.e. exp((l - m) / T) >= min_p (a prefix of the ranking).
  const float min_p = P.min_p;
  auto in_k = [=](float l, int64_t j) { return isfinite(l) && rank_key(l, j) >= ck; };
  auto in_s = [=](float l, int64_t j) { return in_k(l, j) && (min_p <= 0.0f || rel_prob(l, m, inv_t) >= min_p); };
  u64 total_k = 0, mass_s = 0;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float l = x[j];
    if (!in_k(l, j)) continue;
    const float e = rel_prob(l, m, inv_t);
    total_k += fixed(e);
    if (min_p <= 0.0f || e >= min_p) mass_s += fixed(e);
  }
  total_k = block_sum(total_k, sm);
  mass_s = block_sum(mass_s, sm);

  // top-p: the shortest prefix (within the min-p set) whose mass reaches top_p of the top-k mass.
  uint64_t cp = 0;
  u64 mass_f = mass_s;
  if (P.top_p < 1.0f) {
    u64 target = static_cast<u64>(ceil(static_cast<double>(P.top_p) * static_cast<double>(total_k)));
    if (target < 1) target = 1;
    if (mass_s >= target) {
      cp = radix_select<true>(x, n, in_s, w_of, target, sm);
      u64 f = 0;
      for (int64_t j = threadIdx.x; j < n; j += kThreads) {
        const float l = x[j];
        if (in_s(l, j) && rank_key(l, j) >= cp) f += w_of(l);
      }
      mass_f = block_sum(f, sm);
    }
  }

  // The draw: r in [0, mass_f) from the row's uniform; the token whose weight interval (in id
  // order) holds r. Tokens of zero weight (below 2^-40 of the top) hold no interval.
  u64 r = static_cast<u64>(P.uniform * static_cast<double>(mass_f));
  if (r >= mass_f) r = mass_f - 1;
  if (threadIdx.x == 0) sm.pick = -1;
  u64 running = 0;
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t j = base + threadIdx.x;
    u64 w = 0;
    if (j < n) {
      const float l = x[j];
      if (in_s(l, j) && rank_key(l, j) >= cp) w = w_of(l);
    }
    u64 chunk = 0;
    const u64 incl = block_scan(w, sm, &chunk);
    if (w > 0 && running + incl > r && running + incl - w <= r) sm.pick = j;
    running += chunk;
    if (running > r) break;  // uniform across the block: every thread has the same running sum
  }
  __syncthreads();
  if (threadIdx.x == 0) ids[blockIdx.x] = static_cast<int32_t>(sm.pick >= 0 ? sm.pick : 0);
}

__global__ void adjust_kernel(float* logits, int64_t n, const DevLogitAdjust* adj, int64_t n_adj,
                              const DevSampleRow* rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_adj) return;
  const DevLogitAdjust e = adj[i];
  if (e.token < 0 || e.token >= n) return;
  const DevSampleRow& P = rows[e.row];
  float& l = logits[static_cast<int64_t>(e.row) * n + e.token];
  float v = __fadd_rn(l, e.bias);
  if (e.in_context && P.repetition_penalty != 1.0f)
    v = v > 0.0f ? __fdiv_rn(v, P.repetition_penalty) : __fmul_rn(v, P.repetition_penalty);
  if (e.n_generated > 0 && (P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f))
    v = __fsub_rn(v, __fadd_rn(P.presence_penalty, __fmul_rn(P.frequency_penalty, static_cast<float>(e.n_generated))));
  l = v;
}

}  // namespace

__global__ void mask_kernel(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* words,
                            int64_t n_words) {
  const int64_t i = blockIdx.y;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= vocab) return;
  if (!((words[i * n_words + (t >> 5)] >> (t & 31)) & 1u)) logits[rows[i] * vocab + t] = -INFINITY;
}

void launch_mask_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* words, int64_t n_words,
                        int64_t n_masks, cudaStream_t s) {
  if (n_masks == 0) return;
  const dim3 grid(static_cast<unsigned>((vocab + 255) / 256), static_cast<unsigned>(n_masks));
  mask_kernel<<<grid, 256, 0, s>>>(logits, vocab, rows, words, n_words);
  KILN_CUDA_LAUNCH_CHECK("mask_logits");
}

void launch_adjust_logits(float* logits, int64_t vocab, const DevLogitAdjust* adjust, int64_t n_adjust,
                          const DevSampleRow* rows, cudaStream_t s) {
  if (n_adjust == 0) return;
  adjust_kernel<<<grid_for(n_adjust, 256), 256, 0, s>>>(logits, vocab, adjust, n_adjust, rows);
  KILN_CUDA_LAUNCH_CHECK("adjust_logits");
}

void launch_sample_rows(const float* logits, int64_t n_rows, int64_t vocab, const DevSampleRow* rows, int32_t* ids,
                        cudaStream_t s) {
  if (n_rows == 0) return;
  sample_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, s>>>(logits, vocab, rows, ids);
  KILN_CUDA_LAUNCH_CHECK("sample_rows");
}

}  // namespace kiln::backend::cuda
