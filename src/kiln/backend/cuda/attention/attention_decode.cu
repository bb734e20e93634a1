// Paged attention, decode (semantics: Backend::attention in backend.h): split-K flash decoding,
//   grid (token, kv head, split), so a long context or a batch of one still fills the GPU; a block
//   writes the output (one split) or (m, l, acc[head_dim]) partials, merged by the last block of the
//   splits to finish (tiled kernel, arrival counters) or by attn_combine_kernel.
//   K/V rows are read once per GQA group. The tiled kernel (head_dim 64/128/256) is bandwidth-bound:
//   32-key tiles per warp, lane-per-key scores with 16-byte loads, online softmax, lane-per-dims P·V.
//   Other head dims (the tiny test models) take the generic kernel: a warp per key, scores kept in
//   shared memory. The prefill kernel is in attention_prefill.cu.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "kiln/backend/cuda/attention/kv_read.cuh"
#include "kiln/backend/cuda/quant/qx.cuh"

namespace kiln::backend::cuda {

namespace {

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

// LAT (the latency form, head_dim <= 128; attention_decode_plan's choice for grids of at most one
// block per SM): 8 warps instead of 4, a tile's V rows requested with its K rows (one memory round
// trip per tile instead of three), and each warp's first tile requested before pdl_wait for the keys
// earlier steps wrote (stable_keys), so that its DRAM round trip overlaps the wait for the kernels
// before. On the H200 (llama-3-8b, batch 1, 150-token context, clock64 probes) the first tile's
// scores came ~11,000 cycles after the wait when its rows were requested after it.
template <int HD, int G, bool LAT>
__global__ void __launch_bounds__(LAT ? 256 : kDecodeThreads, LAT || HD > 128 ? 1 : G > 4 ? 3 : 4)
    attn_decode_tiled_kernel(AttnArgs a, int n_splits, int kps, float* partials, unsigned* counters, QxOut qx) {
  KILN_STAMP_SCOPE(kStampAttnTiled);
  pdl_trigger();
  static_assert(!LAT || HD <= 128, "the latency form holds a whole K row per lane");
  constexpr int W = LAT ? 8 : kDecodeWarps;    // warps per block
  constexpr int DPL = HD / 32;                 // V dims per lane
  constexpr int KCH = HD < 128 ? HD : 128;     // K dims per lane per load round
  constexpr int KV16 = KCH / 8;                // 16-byte K loads in flight per lane (<= 16: 64 registers)
  // V rows in flight per warp (a multiple of 4 dividing 32): LAT, the tile's 32 rows with its K
  // rows; else 16 (8 at 256 dims) after the scores.
  constexpr int U = LAT ? kTile : HD <= 128 ? 16 : 8;
  // Shared memory, in floats. Tile loop: q_s [G][HD] (q * scale; rows >= ng zero), p_s [warps][G][32].
  // Merge (after a barrier, reusing it): acc_s [warps][G][HD], m_s [warps][G], l_s [warps][G].
  constexpr int kLoopFloats = G * HD + W * G * kTile;
  constexpr int kMergeFloats = W * G * (HD + 2);
  __shared__ __align__(16) float smem[kLoopFloats > kMergeFloats ? kLoopFloats : kMergeFloats];
  __shared__ float y_s[G * HD];  // the block's output rows (bf16-rounded), for qx
  using VT = typename BfVec<DPL>::T;

  const DecodeBlock b = decode_block(a, kps);
  if (b.ng <= 0) return;  // not reached for groups <= 16 (a chunk is never empty)
  const int t = b.t, kvh = b.kvh, h0 = b.h0, ng = b.ng;
  const SplitRange& r = b.r;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t q_width = int64_t{a.n_heads} * HD;
  const __nv_bfloat16* kc = static_cast<const __nv_bfloat16*>(a.k_cache);
  const __nv_bfloat16* vc = static_cast<const __nv_bfloat16*>(a.v_cache);
  const int64_t kv_width = int64_t{a.n_kv_heads} * HD, head_off = int64_t{kvh} * HD;
  const auto slot_of = [&](int tile) { return key_slot(a, r, tile * kTile + lane); };

  // LAT: a tile's rows in registers, kr (K row of this lane's key) and vr (the tile's V rows),
  // loaded for the keys j0 + tile * 32 + [0, n_in) whose position lies in [lo, hi); the other
  // registers keep their values. A warp's first tile is requested around pdl_wait: before it for
  // the keys earlier steps wrote (index < stable), after it for the others.
  uint4 kr[LAT ? KV16 : 1];
  VT vr[LAT ? U : 1];
  const auto load_tile = [&](int tile, int32_t slot, int64_t lo, int64_t hi) {
    const int n_in = min(kTile, r.nk - tile * kTile);
    const int64_t j = r.j0 + int64_t{tile} * kTile;
    const uint4* krow = reinterpret_cast<const uint4*>(kc + int64_t{slot} * kv_width + head_off);
    const auto in_range = [&](int i) { return r.key(j + i) >= lo && r.key(j + i) < hi; };
    if (lane < n_in && in_range(lane)) {
#pragma unroll
      for (int i = 0; i < KV16; ++i) kr[i] = __ldg(krow + i);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t sl = __shfl_sync(0xffffffffu, slot, u);
      if (u < n_in && in_range(u))
        vr[u] = __ldg(reinterpret_cast<const VT*>(vc + int64_t{sl} * kv_width + head_off) + lane);
    }
  };
  const auto clear_tile = [&]() {
#pragma unroll
    for (int i = 0; i < KV16; ++i) kr[i] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < U; ++u) vr[u] = VT{};
  };
  int32_t next_slot = slot_of(warp);  // step inputs: read before pdl_wait
  int64_t stable = 0;
  if constexpr (LAT) {
    if (warp * kTile < r.nk) {
      stable = stable_keys(a, t);
      clear_tile();
      load_tile(warp, next_slot, 0, stable);
    }
  }
  pdl_wait();  // q and the current token's K/V come from rope_kv_write (launched with launch_pdl)

  if (r.nk == 0) {
    empty_split(a, partials, n_splits, t, h0, ng);
  } else {
    if (LAT && warp * kTile < r.nk) load_tile(warp, next_slot, stable, INT64_MAX);  // this step's keys
    float* q_s = smem;
    float* p_w = smem + G * HD + warp * G * kTile;  // this warp's p [G][32]
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q) + int64_t{t} * q_width + int64_t{h0} * HD;
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
      q_s[i] = i < ng * HD ? __bfloat162float(q[i]) * a.scale : 0.0f;
    __syncthreads();

    // Rows g >= ng of q_s are zero, so those heads compute harmless finite values that are never written.
    float m[G], l[G], acc[G][DPL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[g][i] = 0.0f;
    }

    for (int tile = warp; tile * kTile < r.nk; tile += W) {
      const int n_in = min(kTile, r.nk - tile * kTile);  // keys in this tile (warp-uniform, >= 1)
      const bool valid = lane < n_in;
      const int32_t slot = next_slot;  // this lane's key's cache row; the next tile's requested now
      if ((tile + W) * kTile < r.nk) next_slot = slot_of(tile + W);

      // Scores s[g] = (q_g * scale) · K[j], over K dims [c KCH, +KCH) from k (KV16 16-byte values).
      float s[G];
#pragma unroll
      for (int g = 0; g < G; ++g) s[g] = 0.0f;
      const auto score = [&](const uint4(&k)[KV16], int c) {
#pragma unroll
        for (int i = 0; i < KV16; ++i) {
          float kf[8];
          unpack_bf16<8>(k[i], kf);
          const float4* q4 = reinterpret_cast<const float4*>(q_s + c * KCH + i * 8);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float4 qa = q4[g * (HD / 4)], qb = q4[g * (HD / 4) + 1];
            s[g] = fmaf(kf[0], qa.x, fmaf(kf[1], qa.y, fmaf(kf[2], qa.z, fmaf(kf[3], qa.w, s[g]))));
            s[g] = fmaf(kf[4], qb.x, fmaf(kf[5], qb.y, fmaf(kf[6], qb.z, fmaf(kf[7], qb.w, s[g]))));
          }
        }
      };
      if constexpr (LAT) {
        if (tile != warp) {  // (the first tile was requested around pdl_wait)
          clear_tile();
          load_tile(tile, slot, 0, INT64_MAX);
        }
        score(kr, 0);
      } else {
        const uint4* krow = reinterpret_cast<const uint4*>(kc + int64_t{slot} * kv_width + head_off);
#pragma unroll
        for (int c = 0; c < HD / KCH; ++c) {
          uint4 k[KV16];  // all issued before any is used
#pragma unroll
          for (int i = 0; i < KV16; ++i) k[i] = valid ? __ldg(krow + c * KV16 + i) : make_uint4(0, 0, 0, 0);
          score(k, c);
        }
      }

      // Online softmax over the tile in log2 units (s2 = softcap(s) * log2 e; invalid keys -inf).
      // m_new is finite: lane 0's key is valid and its score finite.
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float s2 = valid ? cap_score(s[g], a.softcap) * kLog2e : -INFINITY;
        const float m_new = fmaxf(m[g], warp_max(s2));
        const float alpha = exp2f(m[g] - m_new);  // 0 on the warp's first tile (m = -inf)
        const float p = exp2f(s2 - m_new);        // 0 for invalid keys
        m[g] = m_new;
        l[g] = fmaf(l[g], alpha, p);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[g][i] *= alpha;
        p_w[g * kTile + lane] = p;
      }
      __syncwarp();

      // acc[g][lane dims] += Σ_k p[g][k] V[k][lane dims] over rows k0 + [0, U) from v. Key k's slot
      // comes from lane k by shuffle; V rows past n_in are not read (zero), and their p is 0.
      const auto weigh = [&](const VT(&v)[U], int k0) {
#pragma unroll
        for (int u = 0; u < U; u += 4) {
          float vf[4][DPL];
#pragma unroll
          for (int e = 0; e < 4; ++e) unpack_bf16<DPL>(v[u + e], vf[e]);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float4 p4 = *reinterpret_cast<const float4*>(p_w + g * kTile + k0 + u);
#pragma unroll
            for (int i = 0; i < DPL; ++i)
              acc[g][i] =
                  fmaf(p4.x, vf[0][i], fmaf(p4.y, vf[1][i], fmaf(p4.z, vf[2][i], fmaf(p4.w, vf[3][i], acc[g][i]))));
          }
        }
      };
      if constexpr (LAT) {
        weigh(vr, 0);
      } else {
        for (int k0 = 0; k0 < n_in; k0 += U) {
          VT v[U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const int32_t sl = __shfl_sync(0xffffffffu, slot, k0 + u);
            v[u] = k0 + u < n_in ? __ldg(reinterpret_cast<const VT*>(vc + int64_t{sl} * kv_width + head_off) + lane)
                                 : VT{};
          }
          weigh(v, k0);
        }
      }
      __syncwarp();  // p_w is rewritten by the next tile
    }

    // Merge the warps: M = max_w m_w, L = Σ_w l_w 2^(m_w - M), o[d] = Σ_w acc_w[d] 2^(m_w - M).
#pragma unroll
    for (int g = 0; g < G; ++g) l[g] = warp_sum(l[g]);
    KILN_STAMP(2);    // a probe build's stamp: warp 0's tiles done
    __syncthreads();  // every warp is done with q_s / p_s, which the merge buffers reuse
    float* acc_s = smem;
    float* m_s = smem + W * G * HD;
    float* l_s = m_s + W * G;
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc_s[(warp * G + g) * HD + lane * DPL + i] = acc[g][i];
      if (lane == 0) m_s[warp * G + g] = m[g], l_s[warp * G + g] = l[g];
    }
    __syncthreads();
    for (int item = threadIdx.x; item < ng * HD; item += blockDim.x) {
      const int g = item / HD, d = item % HD;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < W; ++w) M = fmaxf(M, m_s[w * G + g]);  // finite: warp 0 had a tile
      float L = 0.0f, o = 0.0f;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float mw = m_s[w * G + g];
        if (mw == -INFINITY) continue;  // a warp without tiles
        const float wt = exp2f(mw - M);
        L = fmaf(l_s[w * G + g], wt, L);
        o = fmaf(acc_s[(w * G + g) * HD + d], wt, o);
      }
      const int h = h0 + g;
      if (n_splits == 1) {
        const __nv_bfloat16 y = __float2bfloat16_rn(o / L);
        static_cast<__nv_bfloat16*>(a.out)[int64_t{t} * q_width + int64_t{h} * HD + d] = y;
        y_s[item] = __bfloat162float(y);
      } else {
        float* pp = partial_of(a, partials, n_splits, t, h, blockIdx.z);
        if (d == 0) pp[0] = M * kLn2, pp[1] = L;
        pp[2 + d] = o;
      }
    }

  }

  finish_decode_block<G, HD>(a, n_splits, partials, counters, qx, t, h0, ng, y_s);
}

// ---- decode over a quantized cache (head_dim 64/128, GQA groups <= 8, groups of 32+ values;
// kv_read.cuh's layout): grid (token, kv head, split), 4 warps, the tiled kernel's scheme (without
// its latency form or qx): split-K over the context, the last block of the splits to finish merges
// them (arrival counters; without, attn_combine_kernel). Warp w takes the 32-key tiles w, w+4, ...,
// and requests all of a tile's bytes in one round (the next tile's cache slot already known):
// K codes lane-per-key (16-byte loads, the whole row), V codes as one u32 word per lane (a row is
// KW = HD / CPW words: KPL = 32 / KW rows per warp load, lane sub-group `sub` owns the tile's keys
// [sub * VU, +VU)), and the four scale/bias planes lane-per-key (one f16 per 32-dim chunk).
//   scores: codes to f32 by the 2^23 trick (kv_code_floats: a PRMT and an FADD per code, no I2F),
//           per 32-dim chunk c: scale_c * Σ_d q_d code_d + bias_c * Σ_d q_d (qsum_s), so a code
//           costs one FMA per head; q [G][HD] f32 in shared memory (broadcast reads);
//   softmax: per head one warp max per tile (log2 units), running (m, l, acc) per warp; the tile's
//           p [G][32] and V (scale, bias) [32][NC] go to shared memory;
//   P·V:     lane owns dims [(lane % KW) * CPW, +CPW) of its keys, v = code * scale + bias, p read
//           4 keys at a time; the sub-groups' sums meet by shuffles at the end.
// H200, llama-3-8b heads (bench/cuda_attn_bench, 8-bit): the first form of this kernel (I2F
// conversions, a 64-bit division per V word for its group) ran 1x32k / 8x32k in 269 / 1013 us
// (0.26 / 0.56 TB/s), this one in 71 / 376 us (1.0 / 1.5 TB/s; bf16 97 / 435). Measured slower at
// 8x32k: prefetching the warp's next tile into L2 (390 us), and folding the V bias out of P·V
// (p * scale to shared memory, Σ p * bias per lane: 407 us, its registers spilled).
template <int HD, int G, int QB>
__global__ void __launch_bounds__(kDecodeThreads, G > 4 ? 2 : 3)
    attn_decode_q_kernel(AttnArgs a, int n_splits, int kps, float* partials, unsigned* counters) {
  KILN_STAMP_SCOPE(kStampAttnDecode);
  pdl_trigger();
  constexpr int W = kDecodeWarps, NC = HD / 32;  // NC: 32-dim chunks per row
  constexpr int CPW = 32 / QB;                   // codes per u32 word
  constexpr int KW = HD / CPW;                   // words per head row: 32, 16 or 8
  constexpr int KU = KW / 4;                     // 16-byte loads per K row
  constexpr int KPL = 32 / KW;                   // V rows per warp load
  constexpr int VU = kTile / KPL;                // V words per lane per tile
  // Shared memory, in floats. Tile loop: q_s [G][HD] (q * scale; rows >= ng zero), p_s [W][G][32],
  // sb_s [W][32][NC] float2 (V scale, bias), qsum_s [G][NC]. Merge (after a barrier, reusing it):
  // acc_s [W][G][HD], m_s [W][G], l_s [W][G]; then the split merge's output rows (y_s).
  constexpr int kLoopFloats = G * HD + G * NC + W * G * kTile + W * kTile * NC * 2;
  constexpr int kMergeFloats = W * G * (HD + 2);
  __shared__ __align__(16) float smem[kLoopFloats > kMergeFloats ? kLoopFloats : kMergeFloats];

  const DecodeBlock b = decode_block(a, kps);
  if (b.ng <= 0) return;
  const int t = b.t, kvh = b.kvh, h0 = b.h0, ng = b.ng;
  const SplitRange& r = b.r;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t q_width = int64_t{a.n_heads} * HD;
  const int64_t row_words = int64_t{a.n_kv_heads} * KW;  // u32 words of codes per cache row
  const int64_t row_groups = int64_t{a.n_kv_heads} * HD / a.kv_group;  // scales per cache row
  const uint32_t* kc = static_cast<const uint32_t*>(a.k_cache) + kvh * KW;
  const uint32_t* vc = static_cast<const uint32_t*>(a.v_cache) + kvh * KW;
  const auto* ks = static_cast<const unsigned short*>(a.k_scales);
  const auto* kb = static_cast<const unsigned short*>(a.k_biases);
  const auto* vs = static_cast<const unsigned short*>(a.v_scales);
  const auto* vb = static_cast<const unsigned short*>(a.v_biases);
  int cg[NC];  // chunk c's group within a cache row
#pragma unroll
  for (int c = 0; c < NC; ++c) cg[c] = (kvh * HD + c * 32) / a.kv_group;
  int32_t next_slot = key_slot(a, r, warp * kTile + lane);  // step inputs: read before pdl_wait
  pdl_wait();  // q and the current token's K/V come from rope_kv_write

  if (r.nk == 0) {
    empty_split(a, partials, n_splits, t, h0, ng);
  } else {
    float* q_s = smem;
    float* p_w = smem + G * HD + warp * G * kTile;  // this warp's p [G][32]
    float2* sb_w = reinterpret_cast<float2*>(smem + G * HD + W * G * kTile) + warp * kTile * NC;  // its [32][NC]
    float* qsum_s = smem + G * HD + W * G * kTile + W * kTile * NC * 2;
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q) + int64_t{t} * q_width + int64_t{h0} * HD;
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
      q_s[i] = i < ng * HD ? __bfloat162float(q[i]) * a.scale : 0.0f;
    __syncthreads();
    for (int i = threadIdx.x; i < G * NC; i += blockDim.x) {
      float sum = 0.0f;
      for (int d = 0; d < 32; ++d) sum += q_s[(i / NC) * HD + (i % NC) * 32 + d];
      qsum_s[i] = sum;
    }
    __syncthreads();

    float m[G], l[G], acc[G][CPW];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
      for (int i = 0; i < CPW; ++i) acc[g][i] = 0.0f;
    }
    const int sub = lane / KW, wi = lane % KW;  // V: this lane's keys [sub * VU, +VU), word wi of each row
    for (int tile = warp; tile * kTile < r.nk; tile += W) {
      const int n_in = min(kTile, r.nk - tile * kTile);  // keys in this tile (warp-uniform, >= 1)
      const bool valid = lane < n_in;  // past n_in the slot is 0: loads stay in bounds, results are masked
      const int32_t slot = next_slot;
      if ((tile + W) * kTile < r.nk) next_slot = key_slot(a, r, (tile + W) * kTile + lane);

      // The tile's bytes, all requested before any is used.
      uint4 kw[KU];
      const uint4* krow = reinterpret_cast<const uint4*>(kc + int64_t{slot} * row_words);
#pragma unroll
      for (int i = 0; i < KU; ++i) kw[i] = __ldg(krow + i);
      unsigned short kss[NC], kbs[NC], vss[NC], vbs[NC];
      const int64_t srow = int64_t{slot} * row_groups;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        kss[c] = __ldg(ks + srow + cg[c]), kbs[c] = __ldg(kb + srow + cg[c]);
        vss[c] = __ldg(vs + srow + cg[c]), vbs[c] = __ldg(vb + srow + cg[c]);
      }
      uint32_t vw[VU];
#pragma unroll
      for (int u = 0; u < VU; ++u) {
        const int32_t sl = __shfl_sync(0xffffffffu, slot, sub * VU + u);
        vw[u] = __ldg(vc + int64_t{sl} * row_words + wi);
      }

      // Scores of this lane's key: chunk c's codes are words [c * 32 / CPW, +32 / CPW) of the row.
      float s[G];
#pragma unroll
      for (int g = 0; g < G; ++g) s[g] = 0.0f;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(kw) + c * (32 / CPW);
        float dot[G];
#pragma unroll
        for (int g = 0; g < G; ++g) dot[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < 32 / CPW; ++j) {  // word j: dims c * 32 + j * CPW + [0, CPW)
          float code[CPW];
          kv_code_floats<QB>(w[j], code);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float4* q4 = reinterpret_cast<const float4*>(q_s + g * HD + c * 32 + j * CPW);
#pragma unroll
            for (int i = 0; i < CPW / 4; ++i) {
              const float4 qv = q4[i];
              dot[g] = fmaf(code[4 * i], qv.x, fmaf(code[4 * i + 1], qv.y, fmaf(code[4 * i + 2], qv.z, fmaf(code[4 * i + 3], qv.w, dot[g]))));
            }
          }
        }
        const float sc = __half2float(__ushort_as_half(kss[c])), bi = __half2float(__ushort_as_half(kbs[c]));
#pragma unroll
        for (int g = 0; g < G; ++g) s[g] = fmaf(sc, dot[g], fmaf(bi, qsum_s[g * NC + c], s[g]));
      }

      // Online softmax over the tile in log2 units (invalid keys -inf; lane 0's key is valid).
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float s2 = valid ? cap_score(s[g], a.softcap) * kLog2e : -INFINITY;
        const float m_new = fmaxf(m[g], warp_max(s2));
        const float alpha = exp2f(m[g] - m_new);
        const float p = exp2f(s2 - m_new);
        m[g] = m_new;
        l[g] = fmaf(l[g], alpha, p);
#pragma unroll
        for (int i = 0; i < CPW; ++i) acc[g][i] *= alpha;
        p_w[g * kTile + lane] = p;
      }
#pragma unroll
      for (int c = 0; c < NC; ++c)  // invalid keys: v = 0 (their scale and bias may be anything)
        sb_w[lane * NC + c] = valid ? make_float2(__half2float(__ushort_as_half(vss[c])), __half2float(__ushort_as_half(vbs[c])))
                                    : make_float2(0.0f, 0.0f);
      __syncwarp();

      // acc[g][lane dims] += Σ_k p[g][k] V[k][lane dims] over this lane's keys k = sub * VU + u.
      const int vchunk = wi * CPW / 32;
#pragma unroll
      for (int u = 0; u < VU; u += 4) {
        float4 p4[G];
#pragma unroll
        for (int g = 0; g < G; ++g) p4[g] = *reinterpret_cast<const float4*>(p_w + g * kTile + sub * VU + u);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 sb = sb_w[(sub * VU + u + e) * NC + vchunk];
          float v[CPW];
          kv_code_floats<QB>(vw[u + e], v);
#pragma unroll
          for (int i = 0; i < CPW; ++i) v[i] = fmaf(v[i], sb.x, sb.y);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float p = e == 0 ? p4[g].x : e == 1 ? p4[g].y : e == 2 ? p4[g].z : p4[g].w;
#pragma unroll
            for (int i = 0; i < CPW; ++i) acc[g][i] = fmaf(p, v[i], acc[g][i]);
          }
        }
      }
      __syncwarp();  // p_w and sb_w are rewritten by the next tile
    }

    // Merge the sub-groups (lanes wi, wi + KW, ... hold the same dims), then the warps:
    // M = max_w m_w, L = Σ_w l_w 2^(m_w - M), o[d] = Σ_w acc_w[d] 2^(m_w - M).
#pragma unroll
    for (int g = 0; g < G; ++g) {
      l[g] = warp_sum(l[g]);
#pragma unroll
      for (int off = KW; off < 32; off <<= 1)
#pragma unroll
        for (int i = 0; i < CPW; ++i) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], off);
    }
    __syncthreads();  // every warp is done with the tile loop's buffers, which the merge reuses
    float* acc_s = smem;
    float* m_s = smem + W * G * HD;
    float* l_s = m_s + W * G;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (sub == 0) {
#pragma unroll
        for (int i = 0; i < CPW; ++i) acc_s[(warp * G + g) * HD + wi * CPW + i] = acc[g][i];
      }
      if (lane == 0) m_s[warp * G + g] = m[g], l_s[warp * G + g] = l[g];
    }
    __syncthreads();
    for (int item = threadIdx.x; item < ng * HD; item += blockDim.x) {
      const int g = item / HD, d = item % HD;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < W; ++w) M = fmaxf(M, m_s[w * G + g]);  // finite: warp 0 scored a key
      float L = 0.0f, o = 0.0f;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float mw = m_s[w * G + g];
        if (mw == -INFINITY) continue;  // a warp without tiles
        const float wt = exp2f(mw - M);
        L = fmaf(l_s[w * G + g], wt, L);
        o = fmaf(acc_s[(w * G + g) * HD + d], wt, o);
      }
      const int h = h0 + g;
      if (n_splits == 1) {
        static_cast<__nv_bfloat16*>(a.out)[int64_t{t} * q_width + int64_t{h} * HD + d] = __float2bfloat16_rn(o / L);
      } else {
        float* pp = partial_of(a, partials, n_splits, t, h, blockIdx.z);
        if (d == 0) pp[0] = M * kLn2, pp[1] = L;
        pp[2 + d] = o;
      }
    }
  }
  // y_s (the split merge's output rows, read only for qx) reuses smem: finish_decode_block's barrier
  // comes before the merge writes it.
  finish_decode_block<G, HD>(a, n_splits, partials, counters, QxOut{}, t, h0, ng, smem);
}

// ---- decode, generic (any head_dim <= 256, e.g. the tiny test models' 8/16/32; and every quantized
// cache, its values read through kv_value): a warp per key.
// Dynamic shared memory: q_s [group][hd] f32, p_s [group][kps] f32, row_s [kps] int64.
__global__ void __launch_bounds__(kDecodeThreads) attn_decode_kernel(AttnArgs a, int n_splits, int kps, float* partials) {
  KILN_STAMP_SCOPE(kStampAttnDecode);
  extern __shared__ float smem[];
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = kDecodeWarps;
  float* q_s = smem;
  float* p_s = q_s + group * hd;
  const int row_off = group * hd + group * kps;  // in floats; rounded up to 8-byte alignment
  int64_t* row_s = reinterpret_cast<int64_t*>(smem + row_off + (row_off & 1));

  const SplitRange r = split_range(a, t, split, kps);
  const int seq = r.seq, nk = r.nk;
  const int64_t j0 = r.j0;
  const int64_t q_width = int64_t{a.n_heads} * hd;

  if (nk == 0) {
    if (n_splits > 1) empty_split(a, partials, n_splits, t, kvh * group, group);
    return;
  }

  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q) + int64_t{t} * q_width + int64_t{kvh} * group * hd;
  for (int i = threadIdx.x; i < group * hd; i += blockDim.x) q_s[i] = __bfloat162float(q[i]);
  for (int i = threadIdx.x; i < nk; i += blockDim.x) row_s[i] = cache_row(a, seq, r.key(j0 + i)) + int64_t{kvh} * hd;
  __syncthreads();

  // Scores: a warp per key, lanes over head_dim; K row kept in registers for all heads of the group.
  for (int i = warp; i < nk; i += n_warps) {
    float kv[kMaxHeadDim / 32];
#pragma unroll
    for (int c = 0; c < kMaxHeadDim / 32; ++c) {
      const int d = lane + 32 * c;
      kv[c] = d < hd ? kv_value(a.k_cache, a.k_scales, a.k_biases, a.kv_bits, a.kv_group, row_s[i] + d) : 0.0f;
    }
    for (int g = 0; g < group; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int c = 0; c < kMaxHeadDim / 32; ++c) {
        const int d = lane + 32 * c;
        if (d < hd) dot = fmaf(kv[c], q_s[g * hd + d], dot);
      }
      dot = warp_sum(dot);
      if (lane == 0) p_s[g * kps + i] = cap_score(dot * a.scale, a.softcap);
    }
  }
  __syncthreads();

  // Softmax over this split, one warp per head: p = exp(s - m), l = sum p.
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup];
  for (int g = warp; g < group; g += n_warps) {
    float m = -INFINITY;
    for (int i = lane; i < nk; i += 32) m = fmaxf(m, p_s[g * kps + i]);
    m = warp_max(m);
    float l = 0.0f;
    for (int i = lane; i < nk; i += 32) {
      const float e = __expf(p_s[g * kps + i] - m);
      p_s[g * kps + i] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) m_s[g] = m, l_s[g] = l;
  }
  __syncthreads();

  // acc[g][d] = sum_i p[g][i] * V[i][d]; threads over (g, d), V rows read coalesced along d.
  const auto vval = [&](int64_t e) { return kv_value(a.v_cache, a.v_scales, a.v_biases, a.kv_bits, a.kv_group, e); };
  for (int item = threadIdx.x; item < group * hd; item += blockDim.x) {
    const int g = item / hd, d = item % hd;
    // 8 independent V loads in flight per thread before they are used (a serial chain of L2
    // round trips was this kernel's cost at large batches).
    float acc = 0.0f;
    int i = 0;
    for (; i + 8 <= nk; i += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = vval(row_s[i + u] + d);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc = fmaf(p_s[g * kps + i + u], v[u], acc);
    }
    for (; i < nk; ++i) acc = fmaf(p_s[g * kps + i], vval(row_s[i] + d), acc);
    const int h = kvh * group + g;
    if (n_splits == 1) {
      static_cast<__nv_bfloat16*>(a.out)[int64_t{t} * q_width + int64_t{h} * hd + d] = __float2bfloat16_rn(acc / l_s[g]);
    } else {
      float* pp = partial_of(a, partials, n_splits, t, h, split);
      if (d == 0) pp[0] = m_s[g], pp[1] = l_s[g];
      pp[2 + d] = acc;
    }
  }
}

// grid (token, head), 128 threads: out = Σ_s acc_s e^(m_s - M) / Σ_s l_s e^(m_s - M), M = max_s m_s.
// The threads read the splits' (m, l) in parallel (a serial pass over many splits was a chain of
// L2 round trips); w_s [n_splits] (dynamic shared memory) holds e^(m_s - M), 0 for empty splits,
// whose acc is never read.
constexpr int kCombineThreads = 128;
__global__ void __launch_bounds__(kCombineThreads) attn_combine_kernel(AttnArgs a, int n_splits, const float* partials) {
  KILN_STAMP_SCOPE(kStampAttnCombine);
  pdl_trigger();
  pdl_wait();
  extern __shared__ float w_s[];
  __shared__ float red_m[kCombineThreads / 32], red_l[kCombineThreads / 32];
  const int t = blockIdx.x, h = blockIdx.y, hd = a.head_dim, stride = hd + 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float* pp = partials + (int64_t{t} * a.n_heads + h) * n_splits * stride;

  float M = -INFINITY;
  for (int s = threadIdx.x; s < n_splits; s += kCombineThreads) M = fmaxf(M, pp[s * stride]);
  M = warp_max(M);
  if (lane == 0) red_m[warp] = M;
  __syncthreads();
  M = red_m[0];
#pragma unroll
  for (int w = 1; w < kCombineThreads / 32; ++w) M = fmaxf(M, red_m[w]);  // finite: split 0 is never empty

  float L = 0.0f;
  for (int s = threadIdx.x; s < n_splits; s += kCombineThreads) {
    const float m = pp[s * stride];
    const float w = m == -INFINITY ? 0.0f : __expf(m - M);
    w_s[s] = w;
    if (w != 0.0f) L = fmaf(pp[s * stride + 1], w, L);
  }
  L = warp_sum(L);
  if (lane == 0) red_l[warp] = L;
  __syncthreads();  // also publishes w_s
  L = 0.0f;
#pragma unroll
  for (int w = 0; w < kCombineThreads / 32; ++w) L += red_l[w];

  for (int d = threadIdx.x; d < hd; d += kCombineThreads) {
    float acc = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float w = w_s[s];
      if (w != 0.0f) acc = fmaf(pp[s * stride + 2 + d], w, acc);
    }
    static_cast<__nv_bfloat16*>(a.out)[(int64_t{t} * a.n_heads + h) * hd + d] = __float2bfloat16_rn(acc / L);
  }
}

}  // namespace

int64_t attention_partials_floats(const AttnArgs& a, int n_splits) {
  return int64_t{a.n_tokens} * a.n_heads * n_splits * (a.head_dim + 2);
}

// Every block's columns are whole groups and whole warps of 4-value slots: equal chunks of heads
// whose width is a multiple of 128 (and of the group size).
bool attention_decode_qx_ok(const AttnArgs& a, int chunks, int group_size) {
  const int group = a.n_heads / a.n_kv_heads, hpc = group / chunks;
  return attention_decode_tiled(a) && group % chunks == 0 && hpc * a.head_dim % 128 == 0 &&
         a.head_dim % group_size == 0;
}

bool attention_decode_quantized(const AttnArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.kv_bits != 0 && (a.head_dim == 64 || a.head_dim == 128) && a.n_heads / a.n_kv_heads <= kTiledMaxGroup &&
         a.kv_group % 32 == 0 && aligned(a.k_cache);
}

bool attention_decode_tiled(const AttnArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.kv_bits == 0 && (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256) && aligned(a.k_cache) &&
         aligned(a.v_cache);
}

namespace {

// The GQA group runs in the plan's near-equal chunks of heads; the kernel's G is the next power of
// two >= the chunk (its extra heads have zero q and are not written). The kernel derives the same
// chunking from gridDim.y.
template <int HD>
void launch_decode_tiled(const AttnArgs& a, const AttnDecodePlan& plan, float* partials, unsigned* counters,
                         const QxOut& qx, cudaStream_t s) {
  const int group = a.n_heads / a.n_kv_heads;
  const int n_chunks = plan.chunks;
  const int hpc = (group + n_chunks - 1) / n_chunks;
  const dim3 grid(a.n_tokens, a.n_kv_heads * n_chunks, plan.n_splits);
  const auto go = [&]<int G>() {
    if constexpr (HD <= 128) {
      if (plan.latency) {
        launch_pdl(attn_decode_tiled_kernel<HD, G, true>, grid, 256, 0, s, a, plan.n_splits, plan.keys_per_split,
                   partials, counters, qx);
        return;
      }
    }
    launch_pdl(attn_decode_tiled_kernel<HD, G, false>, grid, kDecodeThreads, 0, s, a, plan.n_splits,
               plan.keys_per_split, partials, counters, qx);
  };
  if (hpc <= 1) go.template operator()<1>();
  else if (hpc <= 2) go.template operator()<2>();
  else if (hpc <= 4) go.template operator()<4>();
  else go.template operator()<8>();
}

}  // namespace

// Split-K from host-known sizes. With at least two blocks per SM from (token, kv head) alone (batch
// 128 x 8 kv heads = 1024 blocks), one split: the partials' round trip and the merge would cost more
// than they balance. Otherwise enough splits for ~2 blocks per SM (empty splits exit at once):
//  - the latency form where its grid then fits one wave of one block per SM (head_dim <= 128; ~230
//    registers x 256 threads): splits of 256..1024 keys, 256 being one 32-key tile per warp, so a
//    batch-1 step at a 150-token context runs one split, without partials or merge (batch 32 of an 8B
//    model, 256 such blocks in two waves, fell from 5,489 to 5,082 tok/s before the one-wave rule).
//    Its GQA group is then cut into as many equal chunks of heads as still fit that wave (llama-3-8b
//    at batch 1: a block per query head, 32 blocks, instead of one per kv head): each warp's chain of
//    dependent score and P·V instructions is that much shorter, and the kernel is bound by that
//    chain, not by the K/V bytes (re-read from L2 per chunk). H200, llama-3-8b 4-bit batch 1: the
//    attention's time after its release 9.3 -> 6.6 us per layer (bench/stamp_timeline.py), 424.4
//    against 412.5 tok/s (medians of 5 alternating runs, BENCHMARKS.md);
//  - else splits of 128..1024 keys (128: a tile per warp of 4); 1024 keeps long contexts spread.
// The generic kernel (odd head dims) needs <= 1024 keys per split in every case.
AttnDecodePlan attention_decode_plan(const AttnArgs& a, int64_t max_keys, int n_sms) {
  max_keys = std::max<int64_t>(1, max_keys);
  const int64_t blocks = std::max<int64_t>(1, int64_t{a.n_tokens} * a.n_kv_heads), target = 2 * int64_t{n_sms};
  const bool tiled = attention_decode_tiled(a);
  const auto split_in = [&](int64_t step) {  // keys per split: max_keys over `want` splits, in `step`s
    const int64_t want = (target + blocks - 1) / blocks, even = (max_keys + want - 1) / want;
    return std::clamp<int64_t>((even + step - 1) / step * step, step, 1024);
  };
  const int group = a.n_heads / a.n_kv_heads;
  AttnDecodePlan plan{};
  plan.chunks = (group + kTiledMaxGroup - 1) / kTiledMaxGroup;
  int64_t kps = max_keys;
  if (blocks < target) {
    kps = split_in(256);
    const int64_t grid = blocks * plan.chunks * ((max_keys + kps - 1) / kps);
    plan.latency = tiled && a.head_dim <= 128 && grid <= n_sms;
    if (!plan.latency) kps = split_in(128);
    // The most equal chunks that keep the grid one wave and whole 128-column blocks of the output
    // (attention_decode_qx_ok: the block then also writes the o projection's quantized input).
    if (plan.latency) {
      for (int c = group; c > plan.chunks; --c)
        if (group % c == 0 && group / c * a.head_dim % 128 == 0 && grid / plan.chunks * c <= n_sms) {
          plan.chunks = c;
          break;
        }
    }
  } else if (!tiled) {
    kps = std::min<int64_t>(kps, kAttnGenericMaxKeysPerSplit);
  }
  kps = std::max<int64_t>(32, (kps + 31) / 32 * 32);
  plan.keys_per_split = static_cast<int>(kps);
  plan.n_splits = static_cast<int>((max_keys + kps - 1) / kps);
  return plan;
}

void launch_attention_decode(const AttnArgs& a, const AttnDecodePlan& plan, float* partials, unsigned* counters,
                             const QxOut& qx, cudaStream_t s) {
  if (a.n_tokens == 0) return;
  const int n_splits = plan.n_splits, kps = plan.keys_per_split;
  const int group = a.n_heads / a.n_kv_heads;
  if (group > kMaxGroup || a.head_dim > kMaxHeadDim) {
    std::fprintf(stderr, "[cuda] attention: GQA group %d > %d or head_dim %d > %d\n", group, kMaxGroup, a.head_dim,
                 kMaxHeadDim);
    std::abort();
  }
  if (attention_decode_quantized(a)) {
    const dim3 grid(a.n_tokens, a.n_kv_heads, n_splits);
    const auto go = [&]<int HD, int QB>() {
      const auto run = [&](auto kernel) {
        launch_pdl(kernel, grid, kDecodeThreads, 0, s, a, n_splits, kps, partials, counters);
      };
      if (group <= 1) run(attn_decode_q_kernel<HD, 1, QB>);
      else if (group <= 2) run(attn_decode_q_kernel<HD, 2, QB>);
      else if (group <= 4) run(attn_decode_q_kernel<HD, 4, QB>);
      else run(attn_decode_q_kernel<HD, 8, QB>);
    };
    if (a.head_dim == 64) a.kv_bits == 8 ? go.template operator()<64, 8>() : go.template operator()<64, 4>();
    else a.kv_bits == 8 ? go.template operator()<128, 8>() : go.template operator()<128, 4>();
    KILN_CUDA_LAUNCH_CHECK("attention_decode (quantized)");
    if (counters) return;  // the last block of each (token, kv head) merged the splits
  } else if (attention_decode_tiled(a)) {
    switch (a.head_dim) {
      case 64: launch_decode_tiled<64>(a, plan, partials, counters, qx, s); break;
      case 128: launch_decode_tiled<128>(a, plan, partials, counters, qx, s); break;
      default: launch_decode_tiled<256>(a, plan, partials, counters, qx, s); break;
    }
    KILN_CUDA_LAUNCH_CHECK("attention_decode (tiled)");
    if (counters) return;  // the last block of each (token, kv head chunk) merged the splits
  } else {
    if (kps > kAttnGenericMaxKeysPerSplit) {
      std::fprintf(stderr, "[cuda] attention: %d keys per split > %d for head_dim %d\n", kps,
                   kAttnGenericMaxKeysPerSplit, a.head_dim);
      std::abort();
    }
    const size_t smem = sizeof(float) * (group * a.head_dim + group * kps + 2) + sizeof(int64_t) * kps;
    static bool raised = false;  // opt in to more than 48 KB of dynamic shared memory, once
    if (!raised) {
      cudaFuncSetAttribute(attn_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
      raised = true;
    }
    dim3 grid(a.n_tokens, a.n_kv_heads, n_splits);
    attn_decode_kernel<<<grid, kDecodeThreads, smem, s>>>(a, n_splits, kps, partials);
    KILN_CUDA_LAUNCH_CHECK("attention_decode");
  }
  if (n_splits > 1) {
    const size_t smem = sizeof(float) * n_splits;  // w_s
    if (smem > 48 * 1024) {
      std::fprintf(stderr, "[cuda] attention: %d splits exceed the combine kernel's shared memory\n", n_splits);
      std::abort();
    }
    launch_pdl(attn_combine_kernel, dim3(a.n_tokens, a.n_heads), kCombineThreads, smem, s, a, n_splits,
               static_cast<const float*>(partials));
    KILN_CUDA_LAUNCH_CHECK("attention_combine");
  }
}

}  // namespace kiln::backend::cuda
