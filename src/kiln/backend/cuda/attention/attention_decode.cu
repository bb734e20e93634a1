// Paged attention, decode (semantics: Backend::attention in backend.h): split-K flash decoding,
//   grid (token, kv head, split), so a long context or a batch of one still fills the GPU; a block
//   writes the output (one split) or (m, l, acc[head_dim]) partials, merged by the last block of the
//   splits to finish (tiled kernel, arrival counters) or by attn_combine_kernel.
//   K/V rows are read once per GQA group. The tiled kernel (head_dim 64/128/256) is bandwidth-bound:
//   32-key tiles per warp, lane-per-key scores with 16-byte loads, online softmax, lane-per-dims P·V.
//   Other head dims (the tiny test models) take the generic kernel: a warp per key, scores kept in
//   shared memory. A quantized cache's kernel is in attention_decode_quantized.cu, what they share in
//   decode_common.cuh, the prefill kernel in attention_prefill.cu.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "kiln/backend/cuda/attention/decode_common.cuh"

namespace kiln::backend::cuda {

using namespace decode;

namespace {

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
      float M, L, o;
      merge_warps<W, G, HD>(m_s, l_s, acc_s, g, d, M, L, o);
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
    launch_decode_quantized(a, n_splits, kps, partials, counters, s);
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
