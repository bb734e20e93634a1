// Paged attention, decode over a quantized cache (kv_read.cuh's layout; semantics: Backend::attention
// in backend.h): the tiled kernel's scheme of attention_decode.cu over codes, and its launch.
#include "kiln/backend/cuda/attention/decode_common.cuh"

namespace kiln::backend::cuda::decode {

namespace {

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
      float M, L, o;
      merge_warps<W, G, HD>(m_s, l_s, acc_s, g, d, M, L, o);
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

}  // namespace

void launch_decode_quantized(const AttnArgs& a, int n_splits, int kps, float* partials, unsigned* counters,
                             cudaStream_t s) {
  const int group = a.n_heads / a.n_kv_heads;
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
}

}  // namespace kiln::backend::cuda::decode
