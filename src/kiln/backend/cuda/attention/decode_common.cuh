// What the decode attention kernels share (attention_decode.cu: the tiled and generic kernels and
// the launch; attention_decode_quantized.cu: the kernel over a quantized cache): key ranges of a
// split, the partials' layout, the tiled blocks' heads and keys, the merges of warps and of splits,
// and the block's end (split merge by arrival counters, qx). Device code only, in decode::.
#pragma once
#include <cmath>
#include <cstdint>

#include "kiln/backend/cuda/attention/kv_read.cuh"
#include "kiln/backend/cuda/quant/qx.cuh"

namespace kiln::backend::cuda::decode {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kMaxGroup = 16;    // n_heads / n_kv_heads handled by one generic decode block
constexpr int kMaxHeadDim = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The cache slot (block * block_size + offset) of key j of sequence seq, from its block table.
__device__ __forceinline__ int32_t table_slot(const AttnArgs& a, int seq, int64_t j) {
  return a.block_tables[int64_t{seq} * a.max_blocks + j / a.block_size] * a.block_size +
         static_cast<int32_t>(j % a.block_size);
}
// Key j's row offset (in elements) in the caches.
__device__ __forceinline__ int64_t cache_row(const AttnArgs& a, int seq, int64_t j) {
  return int64_t{table_slot(a, seq, j)} * (int64_t{a.n_kv_heads} * a.head_dim);
}

__device__ __forceinline__ float cap_score(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }

// The keys of one (token, split): the token sees keys [0, n_sink) and [lo, pos] (backend.h; n_sink >
// 0 only for a rotating cache whose window has left the first keys), numbered v = 0, 1, ... in that
// order; the split takes v in [j0, j0 + nk). key() maps v back to the key's position.
struct SplitRange {
  int seq;
  int64_t j0;
  int nk;  // keys in the split; 0: an empty split (the context is shorter than the grid allows for)
  int n_sink;
  int64_t skip;  // lo - n_sink: added to v >= n_sink
  __device__ __forceinline__ int64_t key(int64_t v) const { return v < n_sink ? v : v + skip; }
};
__device__ __forceinline__ SplitRange split_range(const AttnArgs& a, int t, int split, int kps) {
  const int64_t pos = a.token_pos[t];
  const int64_t lo = a.window > 0 ? max(int64_t{0}, pos - a.window + 1) : 0;
  const int n_sink = a.window > 0 ? static_cast<int>(min(int64_t{max(a.sink, 0)}, lo)) : 0;
  const int64_t n_vis = n_sink + pos - lo + 1;
  const int64_t j0 = int64_t{split} * kps;
  const int64_t j1 = min(n_vis - 1, j0 + kps - 1);  // inclusive
  return {a.token_seq[t], j0, j0 <= j1 ? static_cast<int>(j1 - j0 + 1) : 0, n_sink, lo - n_sink};
}

// (m, l, acc[hd]) partial of (token t, head h, split): the layout attn_combine_kernel reads; m in
// natural-log units, acc and l relative to e^m.
__device__ __forceinline__ float* partial_of(const AttnArgs& a, float* partials, int n_splits, int t, int h, int split) {
  return partials + ((int64_t{t} * a.n_heads + h) * n_splits + split) * (a.head_dim + 2);
}

// ---- decode, tiled (head_dim 64/128/256): bandwidth-bound split-K flash decoding.
// grid (token, kv head x head chunk, split), 4 warps. A block owns query heads h0 + [0, ng) of one
// kv head (the whole GQA group, or a chunk of it: groups over 8, and in the latency form as many
// chunks as fit one wave; attention_decode_plan) and keys j0 + [0, nk).
// Warp w takes the 32-key tiles w, w+4, ...; per tile:
//   scores: lane i scores key i with its whole K row in flight (16-byte loads, <= 128 dims a round),
//           against q [G][HD] f32 in shared memory (same address for all lanes: broadcast reads);
//   softmax: per head one warp max per tile (log2 units), running (m, l, acc) per warp; l is kept
//           per lane and summed over the warp once at the end;
//   P·V:     all lanes take the same key, lane owns dims [lane*DPL, lane*DPL+DPL) (one vector load
//           per V row, a warp reads the row coalesced), p read from shared memory 4 keys at a time,
//           U V rows in flight.
// The warps' partials merge through shared memory; the block writes out (one split) or partials.

// Unpacks N bf16 values packed in 32-bit words (element 0 in the low half: little endian).
template <int N, typename V>
__device__ __forceinline__ void unpack_bf16(const V& v, float (&f)[N]) {
  static_assert(sizeof(V) == N * sizeof(uint16_t) && N % 2 == 0);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// One lane's DPL dims of a V row as one load: 4, 8 or 16 bytes.
template <int DPL> struct BfVec;
template <> struct BfVec<2> { using T = uint32_t; };
template <> struct BfVec<4> { using T = uint2; };
template <> struct BfVec<8> { using T = uint4; };

constexpr int kTile = 32;          // keys per warp tile: lane i scores key i
constexpr int kTiledMaxGroup = 8;  // heads per tiled block; larger groups run in chunks (K/V re-read from L2)

// The heads and keys of a tiled block, grid (token, kv head x head chunk, split):
// token t, kv head kvh, query heads h0 + [0, ng) (a chunk of the GQA group; the host chose the
// chunks, gridDim.y / n_kv_heads of them), the split's keys r.
struct DecodeBlock {
  int t, kvh, h0, ng;
  SplitRange r;
};
__device__ __forceinline__ DecodeBlock decode_block(const AttnArgs& a, int kps) {
  const int group = a.n_heads / a.n_kv_heads, n_chunks = gridDim.y / a.n_kv_heads;
  const int hpc = (group + n_chunks - 1) / n_chunks;  // heads per chunk
  const int kvh = blockIdx.y / n_chunks, g0 = (blockIdx.y % n_chunks) * hpc;
  return {static_cast<int>(blockIdx.x), kvh, kvh * group + g0, min(hpc, group - g0),
          split_range(a, blockIdx.x, blockIdx.z, kps)};
}

// The cache slot (block * block_size + offset) of key i of the split; 0 past its keys. Block
// tables are step inputs, uploaded before the step's first kernel: readable before pdl_wait.
__device__ __forceinline__ int32_t key_slot(const AttnArgs& a, const SplitRange& r, int i) {
  return i < r.nk ? table_slot(a, r.seq, r.key(r.j0 + i)) : 0;
}

// An empty split (the context is shorter than the grid allows for) of token t, heads h0 + [0, ng):
// partials the merge skips (one split is never empty).
__device__ __forceinline__ void empty_split(const AttnArgs& a, float* partials, int n_splits, int t, int h0, int ng) {
  for (int g = threadIdx.x; g < ng; g += blockDim.x) {
    float* pp = partial_of(a, partials, n_splits, t, h0 + g, blockIdx.z);
    pp[0] = -INFINITY;
    pp[1] = 0.0f;
  }
}

// The merge of attn_combine_kernel for heads h0 + [0, ng) of token t, by one block of the tiled kernel
// (the last of the splits to finish): warp w takes heads w, w + warps, ... (lanes over the splits) for
// the weights e^(m_s - M) and L, then each thread a strided set of (head, dim) outputs, stored to
// out and, bf16-rounded, to y_s. Partials are read from L2 (other blocks wrote them).
template <int G, int HD>
__device__ __forceinline__ void combine_splits(const AttnArgs& a, float* partials, int n_splits, int t, int h0, int ng,
                               float* y_s) {
  __shared__ float w_s[G][kAttnFusedMaxSplits], l_s[G];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int g = warp; g < ng; g += static_cast<int>(blockDim.x >> 5)) {
    const float* pp = partial_of(a, partials, n_splits, t, h0 + g, 0);
    float m[kAttnFusedMaxSplits / 32], l[kAttnFusedMaxSplits / 32];  // (m, l) of splits lane + 32 i
    float M = -INFINITY;
#pragma unroll
    for (int i = 0; i < kAttnFusedMaxSplits / 32; ++i) {
      const int sp = lane + 32 * i;
      m[i] = sp < n_splits ? __ldcg(pp + int64_t{sp} * (HD + 2)) : -INFINITY;
      l[i] = sp < n_splits ? __ldcg(pp + int64_t{sp} * (HD + 2) + 1) : 0.0f;
      M = fmaxf(M, m[i]);
    }
    M = warp_max(M);  // finite: split 0 is never empty
    float L = 0.0f;
#pragma unroll
    for (int i = 0; i < kAttnFusedMaxSplits / 32; ++i) {
      const int sp = lane + 32 * i;
      const float w = m[i] == -INFINITY ? 0.0f : __expf(m[i] - M);
      if (sp < n_splits) w_s[g][sp] = w;
      if (w != 0.0f) L = fmaf(l[i], w, L);
    }
    L = warp_sum(L);
    if (lane == 0) l_s[g] = L;
  }
  __syncthreads();
  const int64_t q_width = int64_t{a.n_heads} * HD;
  for (int item = threadIdx.x; item < ng * HD; item += blockDim.x) {
    const int g = item / HD, d = item % HD;
    const float* pp = partial_of(a, partials, n_splits, t, h0 + g, 0) + 2 + d;
    float acc = 0.0f;
#pragma unroll 8
    for (int sp = 0; sp < n_splits; ++sp) {  // loads not behind the branch: a round's loads in flight
      const float v = __ldcg(pp + int64_t{sp} * (HD + 2)), w = w_s[g][sp];  // (an empty split's v: unused)
      if (w != 0.0f) acc = fmaf(v, w, acc);
    }
    const __nv_bfloat16 y = __float2bfloat16_rn(acc / l_s[g]);
    static_cast<__nv_bfloat16*>(a.out)[int64_t{t} * q_width + int64_t{h0 + g} * HD + d] = y;
    y_s[item] = __bfloat162float(y);
  }
}

// The end of a tiled block, y_s its output rows (one split) or unused: with splits,
// the block's arrival is counted and the last block of (token, heads) to finish merges them (without
// counters attn_combine_kernel does); then, with qx, the o projection's quantized input for the
// block's columns.
template <int G, int HD>
__device__ __forceinline__ void finish_decode_block(const AttnArgs& a, int n_splits, float* partials,
                                                    unsigned* counters, const QxOut& qx, int t, int h0, int ng,
                                                    float* y_s) {
  if (n_splits > 1) {  // the last block of (token, heads) to finish merges the splits (counters set)
    if (counters == nullptr) return;  // attn_combine_kernel does
    __shared__ int last;
    __threadfence();  // this block's partials, visible before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned* c = counters + int64_t{t} * gridDim.y + blockIdx.y;
      last = atomicAdd(c, 1u) == static_cast<unsigned>(n_splits - 1);
      if (last) *c = 0u;  // ready for the next launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    combine_splits<G, HD>(a, partials, n_splits, t, h0, ng, y_s);
  }
  if (qx.base) {  // the o projection's quantized input: this block's columns [h0 HD, (h0 + ng) HD)
    __syncthreads();
    auto* codes = static_cast<uint32_t*>(qx.base);
    auto* meta = reinterpret_cast<float2*>(static_cast<char*>(qx.base) + qx.L.code_bytes);
    for (int slot = threadIdx.x; slot < ng * HD / 4; slot += blockDim.x) {  // whole warps (host check)
      const float f[4] = {y_s[4 * slot], y_s[4 * slot + 1], y_s[4 * slot + 2], y_s[4 * slot + 3]};
      const int64_t col = int64_t{h0} * HD + 4 * slot;
      switch (qx.group_size) {
        case 32: qx_store4<32>(f, t, col, qx.L, codes, meta); break;
        case 64: qx_store4<64>(f, t, col, qx.L, codes, meta); break;
        default: qx_store4<128>(f, t, col, qx.L, codes, meta); break;
      }
    }
  }
}

// The first key of token t's sequence that this launch may write (its lowest position among the
// step's tokens): keys before it hold earlier steps' K/V and may be read before pdl_wait. Step
// inputs only (token_seq / token_pos are uploaded before the step's first kernel).
__device__ __forceinline__ int64_t stable_keys(const AttnArgs& a, int t) {
  const int seq = a.token_seq[t];
  int64_t lo = a.token_pos[t];
  for (int i = 0; i < a.n_tokens; ++i)
    if (a.token_seq[i] == seq) lo = min(lo, int64_t{a.token_pos[i]});
  return lo;
}

// The warps' partials of head g, dim d merged (m_s, l_s [W][G] and acc_s [W][G][HD] in shared memory):
// M = max_w m_w, L = Σ_w l_w 2^(m_w - M), o = Σ_w acc_w[d] 2^(m_w - M); warps without keys are skipped.
template <int W, int G, int HD>
__device__ __forceinline__ void merge_warps(const float* m_s, const float* l_s, const float* acc_s, int g, int d,
                                            float& M, float& L, float& o) {
  M = -INFINITY;
#pragma unroll
  for (int w = 0; w < W; ++w) M = fmaxf(M, m_s[w * G + g]);  // finite: warp 0 scored a key
  L = 0.0f;
  o = 0.0f;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    const float mw = m_s[w * G + g];
    if (mw == -INFINITY) continue;  // a warp without keys
    const float wt = exp2f(mw - M);
    L = fmaf(l_s[w * G + g], wt, L);
    o = fmaf(acc_s[(w * G + g) * HD + d], wt, o);
  }
}


// The launch of attn_decode_q_kernel (attention_decode_quantized.cu) for a cache that
// attention_decode_quantized() accepts: grid (token, kv head, split); with counters the last block of
// each (token, kv head) merges the splits, else attn_combine_kernel must.
void launch_decode_quantized(const AttnArgs& a, int n_splits, int kps, float* partials, unsigned* counters,
                             cudaStream_t s);

}  // namespace kiln::backend::cuda::decode
