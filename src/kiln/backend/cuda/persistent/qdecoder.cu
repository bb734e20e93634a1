// A whole stack of Llama-style decoder layers for one decode token in one persistent launch
// (qkernels.h: launch_q4_decoder). A batch-1 step of separate kernels leaves DRAM idle at every
// kernel boundary (~7 per layer: the small kernels' latency chains and each GEMV's ramp-up and last
// wave; BENCHMARKS.md). Here one block per SM runs every layer: its producer warp streams the
// block's tiles of every matrix of every layer, in the order they are used, through the ring of
// qring.cuh, and never waits for activations — only for free slots — so the weights of the o
// projection and the MLP keep arriving while the consumers wait at a grid barrier or run the
// attention. Per layer, the consumer warps of each block:
//   A  x's RMSNorm (recomputed by every block from the residual, as rms_norm does it), its qx, then
//      the block's tiles of q | k | v (one 16-row tile space over the three matrices) -> qkv;
//   B  (after a grid barrier) the attention, in items (query head, key split; nb / n_heads splits per
//      head): RoPE of q and of the head's k (rope_pair, as rope_kv_write rounds them), the new k / v
//      into the cache (by the split holding the token, of the GQA group's first head), online
//      softmax over the split's keys (16 warps, a key per warp at a time); the last split of a head
//      to finish merges the others' partials -> attn;
//   C  (barrier) attn's qx, the block's o tiles, added into the residual rows it owns;
//   D  (barrier) the MLP norm and qx, gate/up tile pairs -> h = act(gate) * up;
//   E  (barrier) h's qx, down tiles, added into the residual; a barrier before the next layer.
// The values of the separate ops up to f32 summation order (the GEMV tiles sum their quads in
// another order, the attention its keys); rounding points are the same (bf16 q/k/v after the GEMV
// and after RoPE, bf16 attention output, bf16 GEMV outputs before each residual add).
//
// The default for one-token 4-bit decode (CudaBackend::set_fused_decoder; BENCHMARKS.md, fourteenth
// to eighteenth sessions): llama-3-8b 4-bit batch 1 at ~535-556 tok/s against ~400-440 for the separate
// ops. The ring's copies evict first from L2 (qring.cuh): without that the ~115 MB of weights per layer
// pushed h, the residual and the caches out of the 50 MB L2 between their write and their read, and the
// stack was slower than the separate ops (380-394 tok/s). Per-block timestamps of one layer (µs from its
// start, mean / last block; eighteenth session): norm + qx 1.2, q/k/v tiles 4.6 / 4.9, barrier 7.1,
// attention 12.6 / 14.5, barrier 15.2, attn's qx 15.9, o 18.6 / 19.2, barrier 20.9, norm 21.9, gate/up
// 35.8 / 38.1, barrier 39.0, h's qx 40.7, down 47.6 / 48.8, barrier 50.5. The consume phases (~27 µs)
// are compute-bound (nineteenth session: ~10% of gate/up waits for a slot, and with no weight copies at all
// it is only 5% shorter; ~80 warp instructions per quad): the consumers are only ~1.2x faster than DRAM,
// so the ring cannot get ahead to hide the chain of barriers, attention, norms and qx.
#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cstdlib>

#include "kiln/backend/cuda/persistent/qring.cuh"
#include "kiln/backend/cuda/ops/row_ops.cuh"

namespace kiln::backend::cuda {

int qring::smem_optin() {
  static const int v = [] {
    int dev = 0, bytes = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return major >= 9 ? bytes : 0;  // TMA bulk copies and mbarrier tx counts: sm_90
  }();
  return v;
}

namespace {

using namespace qring;

// The step's token (its position, cache slot and sequence) and the head of its sequence's block table,
// read once at the kernel's start into shared memory: each grid barrier's acquire load invalidates L1,
// so reading them from global memory cost every layer's attention an L2 round trip for the token and
// another for the table before its first cache load (per-block timestamps: that load 1.2 -> 0.66 us
// after the barrier).
constexpr int kTableCache = 192;  // block-table entries kept (contexts up to 192 cache blocks)
struct StepInfo {
  int pos, slot, seq, n_table;
  int table[kTableCache];
};
// The kernel's static shared memory (StepInfo, the attention's `last`, what the compiler adds), left
// out of the dynamic size: read from the kernel, not assumed, as the ring's slots are what is left (at
// group size 64 its tenth slot, 5 per group rather than 4, fits by ~400 bytes).
int static_smem();
constexpr int kNormSlots = kQDecoderMaxDim / 8 / (kConsumers * 32);  // residual slots (8 values) per consumer thread

// Shared memory: [mbarriers][red][qx codes][qx meta][scratch: the norm's partial sums and weights, or
// the attention's q / k / v and per-warp partials][ring slots].
struct DecoderPlan {
  int qd, qo, qf;               // quads per row of dim, of q_out (o's input), of ffn
  int t_qkv, t_o, t_ffn, t_dn;  // 16-row tiles of q | k | v, o, gate (= up), down
  int tq, tk;                   // of q, of k (= v)
  int slots;                    // per group
  int splits;                   // attention key splits per query head
  int64_t qx_codes_off, qx_meta_off, scratch_off, ring_off, smem;
};

// The attention's q, k, v in f32, then the raw q / k / v (bf16) overlaid by the warps' partials (written
// after the raw values are last read).
int64_t attention_scratch(int64_t hd) { return 3 * hd * 4 + std::max<int64_t>(3 * hd * 2, kConsumers * (hd + 2) * 4); }

// Blocks of a launch on n_sms multiprocessors (one per SM: the grid barrier needs all resident).
int grid_for(int n_sms) { return std::min(n_sms, kGridMaxBlocks); }

DecoderPlan plan_for(const QDecoder& d, int n_sms) {
  DecoderPlan p{};
  p.splits = static_cast<int>(std::max<int64_t>(1, grid_for(n_sms) / d.n_heads));
  const int64_t q_out = d.n_heads * d.head_dim, kv_out = d.n_kv_heads * d.head_dim;
  p.qd = static_cast<int>((d.dim + 127) / 128), p.qo = static_cast<int>((q_out + 127) / 128);
  p.qf = static_cast<int>((d.ffn + 127) / 128);
  p.tq = static_cast<int>(q_out / 16), p.tk = static_cast<int>(kv_out / 16);
  p.t_qkv = p.tq + 2 * p.tk, p.t_o = static_cast<int>(d.dim / 16), p.t_ffn = static_cast<int>(d.ffn / 16);
  p.t_dn = p.t_o;
  const int64_t qmax = std::max({p.qd, p.qo, p.qf});
  p.qx_codes_off = kFixedSmem;
  p.qx_meta_off = p.qx_codes_off + qmax * 256;
  p.scratch_off = (p.qx_meta_off + qmax * (128 / d.group_size) * 8 + 15) / 16 * 16;  // cp.async: 16 B
  const int64_t scratch = 128 + std::max<int64_t>(d.dim * 2, attention_scratch(d.head_dim));  // part + norm weights
  p.ring_off = (p.scratch_off + scratch + 127) / 128 * 128;
  if (d.sdt != Dt::f32) p.slots = ring_slots(p.ring_off + static_smem(), d.group_size);
  p.smem = p.ring_off + int64_t{kGroups} * p.slots * slot_bytes(d.group_size);
  return p;
}

__device__ __forceinline__ int pieces(int quads) { return (quads + kPieceQuads - 1) / kPieceQuads; }

// A unit with its tile and piece, advanced by counting (a division per unit was ~35 instructions on
// every piece's path: the ncu source profile of the nineteenth session).
struct Unit {
  int u, tile, piece;
};

// A block's units of one phase (its tiles' pieces, unit u = tile u / per, piece u % per; both matrices'
// pieces for a gate/up pair) split between the two consumer groups: group 0 the first half in order,
// group 1 the rest, so that an odd tile count does not leave a group idle for a whole job (3 q/k/v
// tiles: 4 + 2 pieces; 7 gate/up pairs: 4 + 3 jobs). A tile the halves split (`shared`) comes last in
// group 1's order too, so both groups' partial sums of it are in shared memory at the phase's end.
// Block b of nb takes tiles [t0, (b + 1) T / nb) of a phase of T, t0 = b T / nb (the producer and the
// consumers both build it here, so they agree).
struct Split {
  int t0, per, n, h, shared;  // first tile, units per tile, units, group 0's units, the shared tile (-1: none)
  __device__ Split(int T, int Q, int b, int nb)
      : t0(b * T / nb), per(pieces(Q)), n(((b + 1) * T / nb - t0) * per), h((n + 1) / 2),
        shared(h % per ? h / per : -1) {}
  __device__ int count(int g) const { return g == 0 ? h : n - h; }
  __device__ Unit at(int u) const { return {u, u / per, u % per}; }
  // Group g's first unit, and the unit after x in its order (group 1 goes on from the end to h).
  __device__ Unit first(int g) const {
    const int rest = (shared + 1) * per;
    return at(g == 0 ? 0 : shared >= 0 && rest < n ? rest : h);
  }
  __device__ void next(Unit& x) const {
    if (x.u + 1 == n) x = at(h);
    else if (++x.u, ++x.piece == per) x.piece = 0, ++x.tile;
  }
};

// The consumers' sum of every consumer thread's v, in block_sum's order (so a 512-thread row norm
// gets rms_norm's bits); part: 16 floats of shared memory.
__device__ __forceinline__ float consumers_sum(float v, float* part) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  consumers_sync();
  float s = (threadIdx.x & 31) < kConsumers ? part[threadIdx.x & 31] : 0.0f;
  s = warp_sum(s);
  consumers_sync();  // part is reused by the next call
  return s;
}

// Attention work item (query head hq, key split sp of ns) for the step's one token (see the file
// comment); E = head_dim / 32 dims per lane. The block's 16 warps take the split's keys in turn, a
// key per warp at a time, kBatch keys' loads in flight together, then merge in shared memory; with
// ns > 1 the split's (m, l, acc) goes to partials and the last split of the head to arrive (counters
// [hq], back to zero after) merges them into attn. scratch: attention_scratch(head_dim) bytes.
template <int E>
__device__ void attend_split(const QDecoder& d, const QDecoderLayer& L, const StepInfo& st, int hq, int sp, int ns,
                             const __nv_bfloat16* qkv, __nv_bfloat16* attn, float* partials, unsigned* counters,
                             unsigned char* scratch) {
  constexpr int hd = 32 * E, half = hd / 2, kBatch = 4;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t q_out = d.n_heads * hd, kv_out = d.n_kv_heads * hd;
  const int group = static_cast<int>(d.n_heads / d.n_kv_heads), kvh = hq / group;
  float* qf = reinterpret_cast<float*>(scratch);
  float* kf = qf + hd;
  float* vf = kf + hd;
  auto* raw = reinterpret_cast<__nv_bfloat16*>(vf + hd);  // q, k, v of the head as the GEMV stored them
  float* part = vf + hd;  // [warp][hd + 2]: acc, m, l (over raw: written after the keys)
  const int pos = st.pos;  // 32-bit key indices: cheaper divisions
  const int64_t slot = st.slot;
  const int lo_key = L.window > 0 ? max(0, pos - static_cast<int>(L.window) + 1) : 0;
  const int per = (pos - lo_key + ns) / ns;  // keys per split
  const int j_begin = lo_key + sp * per, j_end = min(pos, j_begin + per - 1);  // inclusive
  const bool has_new = j_begin <= pos && pos <= j_end;  // this split holds the token's own key
  const bool writer = has_new && hq % group == 0 && slot >= 0 && slot < d.n_slots;  // stores its k / v
  // The warp's keys j0, j0 + 16, ... (kBatch of them) of the cache, every load in flight together;
  // the first batch is requested before q / k / v are read: it does not depend on this step.
  using Vec = std::conditional_t<E == 4, uint2, uint32_t>;  // a lane's E bf16
  constexpr int kStride = kConsumers * kBatch;
  auto* kc = static_cast<__nv_bfloat16*>(L.k_cache);
  auto* vc = static_cast<__nv_bfloat16*>(L.v_cache);
  auto load_batch = [&](int j0, Vec(&kv)[kBatch], Vec(&vv)[kBatch]) {
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int j = j0 + i * kConsumers;
      if (j <= j_end && j != pos) {
        const int blk = j / d.block_size;
        const int phys = blk < st.n_table ? st.table[blk] : d.block_tables[int64_t{st.seq} * d.max_blocks + blk];
        const int64_t row = (int64_t{phys} * d.block_size + j % d.block_size) * kv_out + kvh * hd + lane * E;
        kv[i] = __ldcg(reinterpret_cast<const Vec*>(kc + row));
        vv[i] = __ldcg(reinterpret_cast<const Vec*>(vc + row));
      }
    }
  };
  Vec kv[kBatch], vv[kBatch];
  load_batch(j_begin + warp, kv, vv);
  if (tid < hd) {
    raw[tid] = __ldcg(qkv + hq * hd + tid);
    if (has_new) {
      raw[hd + tid] = __ldcg(qkv + q_out + kvh * hd + tid);
      raw[2 * hd + tid] = __ldcg(qkv + q_out + kv_out + kvh * hd + tid);
    }
  }
  consumers_sync();
  const float p = static_cast<float>(pos);
  if (tid < half) {
    __nv_bfloat16 lo, hi;
    rope_pair(raw, tid, half, p, d.inv_freq, d.attn_factor, lo, hi);
    qf[tid] = to_f(lo), qf[tid + half] = to_f(hi);
    if (has_new) {
      rope_pair(raw + hd, tid, half, p, d.inv_freq, d.attn_factor, lo, hi);
      kf[tid] = to_f(lo), kf[tid + half] = to_f(hi);
      if (writer) kc[slot * kv_out + kvh * hd + tid] = lo, kc[slot * kv_out + kvh * hd + tid + half] = hi;
    }
  }
  if (tid < hd && has_new) {
    vf[tid] = to_f(raw[2 * hd + tid]);
    if (writer) vc[slot * kv_out + kvh * hd + tid] = raw[2 * hd + tid];
  }
  consumers_sync();

  float q[E], acc[E], m = -FLT_MAX, l = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) q[e] = qf[lane * E + e], acc[e] = 0.0f;
  for (int j0 = j_begin + warp; j0 <= j_end; j0 += kStride) {
    if (j0 > j_begin + warp) load_batch(j0, kv, vv);  // the first batch is in flight since the start
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int j = j0 + i * kConsumers;
      if (j > j_end) break;
      float kx[E], vx[E];
      if (j == pos) {  // the new token: from shared memory (its cache row may not be written yet)
#pragma unroll
        for (int e = 0; e < E; ++e) kx[e] = kf[lane * E + e], vx[e] = vf[lane * E + e];
      } else {
        const auto* kb = reinterpret_cast<const __nv_bfloat16*>(&kv[i]);
        const auto* vb = reinterpret_cast<const __nv_bfloat16*>(&vv[i]);
#pragma unroll
        for (int e = 0; e < E; ++e) kx[e] = to_f(kb[e]), vx[e] = to_f(vb[e]);
      }
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) dot = fmaf(q[e], kx[e], dot);
      const float s = warp_sum(dot) * d.scale;
      const float mn = fmaxf(m, s), c = __expf(m - mn), pe = __expf(s - mn);
      l = l * c + pe;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = fmaf(pe, vx[e], acc[e] * c);
      m = mn;
    }
  }
  float* mine = part + warp * (hd + 2);
#pragma unroll
  for (int e = 0; e < E; ++e) mine[lane * E + e] = acc[e];
  if (lane == 0) mine[hd] = m, mine[hd + 1] = l;
  consumers_sync();
  // (m, l, acc) of parts [n] (stride hd + 2; l = 0: empty) merged for dim tid: acc and l relative
  // to e^M, M the largest m.
  auto merge = [&](auto&& at, int n, float& num, float& den, float& M) {
    M = -FLT_MAX;
    for (int w = 0; w < n; ++w) M = fmaxf(M, at(w, hd));
    num = 0.0f, den = 0.0f;
    for (int w = 0; w < n; ++w) {
      const float lw = at(w, hd + 1), c = lw > 0.0f ? __expf(at(w, hd) - M) : 0.0f;
      den = fmaf(lw, c, den);
      num = fmaf(at(w, tid), c, num);
    }
  };
  float* mine_split = partials + (hq * ns + sp) * (hd + 2);
  if (tid < hd) {
    float num, den, M;
    merge([&](int w, int i) { return part[w * (hd + 2) + i]; }, kConsumers, num, den, M);
    if (ns == 1) {
      attn[hq * hd + tid] = from_f<__nv_bfloat16>(num / den);
    } else {
      mine_split[tid] = num;
      if (tid == 0) mine_split[hd] = M, mine_split[hd + 1] = den;
    }
  }
  if (ns > 1) {
    __shared__ unsigned last;
    consumers_sync();
    if (tid == 0) {
      __threadfence();
      last = atomicAdd(&counters[hq], 1u) == static_cast<unsigned>(ns - 1);
      if (last) counters[hq] = 0, __threadfence();
    }
    consumers_sync();
    if (last && tid < hd) {
      const float* all = partials + hq * ns * (hd + 2);
      float num, den, M;
      merge([&](int w, int i) { return __ldcg(all + w * (hd + 2) + i); }, ns, num, den, M);
      attn[hq * hd + tid] = from_f<__nv_bfloat16>(num / den);
    }
  }
  consumers_sync();  // scratch is reused by the next item
}

template <typename ST, int GS>
__global__ void __launch_bounds__(kThreads, 1)
    q4_decoder_kernel(const __grid_constant__ QDecoder d, DecoderPlan p, unsigned long long* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const Ring ring = ring_at<GS>(smem, p.ring_off, p.slots);
  auto* red = partials_at(smem);
  auto* qx_codes = reinterpret_cast<uint32_t*>(smem + p.qx_codes_off);
  auto* qx_meta = reinterpret_cast<float2*>(smem + p.qx_meta_off);
  unsigned char* scratch = smem + p.scratch_off;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nb = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);  // 32-bit tile indices: fewer registers
  // This block's tiles of each phase: Split, built where used (fewer live registers).
  const int tq = p.tq, tk = p.tk;
  ring.start();

  // Each phase's units split between the groups (Split), the groups' rings fed in turn.
  if (warp == kConsumers) {  // the producer: every piece of the block's jobs, in consumption order
    if (lane != 0) return;
    Cursor k[kGroups];  // each group's ring: where the next piece goes
    // This block's tiles of a phase of T: mt(t) -> (matrix, tile within it); m2 >= 0: a pair's second matrix.
    auto phase = [&](const QDecoderLayer& L, int T, int Q, auto&& mt, int m2 = -1) {
      const Split sp(T, Q, b, nb);
      Unit u[kGroups] = {sp.first(0), sp.first(1)};
      for (int i = 0; i < sp.h; ++i)
        for (int g = 0; g < kGroups; ++g) {
          if (i >= sp.count(g)) continue;
          const int2 m = mt(sp.t0 + u[g].tile);
          ring.issue(g, k[g], L.codes[m.x], L.pairs[m.x], Q, m.y, u[g].piece);
          if (m2 >= 0) ring.issue(g, k[g], L.codes[m2], L.pairs[m2], Q, m.y, u[g].piece);
          sp.next(u[g]);
        }
    };
    for (int l = 0; l < d.n_layers; ++l) {
      const QDecoderLayer& L = d.layers[l];
      phase(L, p.t_qkv, p.qd, [&](int t) {  // q, k, v tiles: matrix and tile within it
        return t < tq ? make_int2(0, t) : t < tq + tk ? make_int2(1, t - tq) : make_int2(2, t - tq - tk);
      });
      phase(L, p.t_o, p.qo, [](int t) { return make_int2(3, t); });
      phase(L, p.t_ffn, p.qd, [](int t) { return make_int2(4, t); }, 5);
      phase(L, p.t_dn, p.qf, [](int t) { return make_int2(6, t); });
    }
    return;
  }

  // The consumers: warp gw of group grp.
  const int grp = warp / kGroupWarps, gw = warp % kGroupWarps, gt = threadIdx.x % (kGroupWarps * 32);
  auto* x = static_cast<__nv_bfloat16*>(d.x);
  auto* qkv = static_cast<__nv_bfloat16*>(d.qkv);
  auto* attn = static_cast<__nv_bfloat16*>(d.attn);
  auto* h = static_cast<__nv_bfloat16*>(d.h);
  Cursor k;  // the group's ring: where its next piece is
  int jg = 0;  // this group's jobs done
  // This block's tiles of a phase of T (two matrices per tile when pair) against the qx in shared memory,
  // this group's units of them (Split); store(row, sum0, sum1) by thread gt < 16 of the tile's group,
  // or after a block barrier by thread < 16 for a tile both groups worked on.
  auto run_jobs = [&](int T, int Q, bool pair, auto&& store) {
    const Split sp(T, Q, b, nb);
    float s0[2] = {0.0f, 0.0f}, s1[2] = {0.0f, 0.0f};
    Unit x = sp.first(grp);
    for (int i = 0, n = sp.count(grp); i < n; ++i, sp.next(x)) {
      const int tl = x.tile, pc = x.piece;
      ring.consume<ST, GS>(grp, gw, k, Q, pc, qx_codes, qx_meta, s0);
      if (pair) ring.consume<ST, GS>(grp, gw, k, Q, pc, qx_codes, qx_meta, s1);
      if (pc + 1 < sp.per && i + 1 < n) continue;  // more of this tile
      float(*rd)[kGroupWarps][16] = red[grp][tl == sp.shared ? 2 : jg++ & 1];
      put_partials(rd, gw, 0, s0);
      if (pair) put_partials(rd, gw, 1, s1);
      s0[0] = s0[1] = s1[0] = s1[1] = 0.0f;
      if (tl == sp.shared) continue;  // added up below
      group_sync(grp);
      if (gt < 16) store((sp.t0 + tl) * 16 + gt, sum_partials(rd, 0, gt), pair ? sum_partials(rd, 1, gt) : 0.0f);
    }
    if (sp.shared >= 0) {
      consumers_sync();
      const int r = threadIdx.x;
      if (r < 16)
        store((sp.t0 + sp.shared) * 16 + r, sum_partials(red[0][2], 0, r) + sum_partials(red[1][2], 0, r),
              pair ? sum_partials(red[0][2], 1, r) + sum_partials(red[1][2], 1, r) : 0.0f);
    }
  };
  // RMSNorm of the residual x into qx: the normed values rounded to bf16 as rms_norm rounds them
  // (the sum of squares in another order), then quantized, from registers; the weights fetch_norm
  // copied into wsm. fetch_norm runs before the grid barrier that precedes the norm: the weights do
  // not depend on it, so their load overlaps the wait.
  float* part = reinterpret_cast<float*>(scratch);
  auto* wsm = reinterpret_cast<__nv_bfloat16*>(scratch + 128);
  auto fetch_norm = [&](const void* w) {
    for (int64_t c = threadIdx.x; c < d.dim / 8; c += kConsumers * 32)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(wsm + c * 8)),
                   "l"(static_cast<const __nv_bfloat16*>(w) + c * 8)
                   : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  auto norm_to_qx = [&]() {
    const int n_slots = p.qd * 16;  // dim / 8 (dim % 128 == 0)
    uint4 v[kNormSlots];
    float ss = 0.0f;
#pragma unroll
    for (int r = 0; r < kNormSlots; ++r) {
      const int slot = threadIdx.x + r * kConsumers * 32;
      v[r] = slot < n_slots ? __ldcg(reinterpret_cast<const uint4*>(x) + slot) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int r = 0; r < kNormSlots; ++r) {
      float f[8];
      bf16x8_to_f(v[r], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = sq_acc(ss, f[e]);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");  // this thread's copies; consumers_sum syncs them all
    ss = consumers_sum(ss, part);
    const float inv = rsqrtf(ss / static_cast<float>(d.dim) + d.eps);
    qx_encode_slots<GS>(v, threadIdx.x, n_slots, qx_codes, qx_meta, [&](int col, float(&f)[8]) {
      float w[8];
      bf16x8_to_f(*reinterpret_cast<const uint4*>(wsm + col), w);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = to_f(from_f<__nv_bfloat16>((f[e] * inv) * w[e]));
    });
    consumers_sync();
  };
  auto add_residual = [&](int row, float v, float) {
    x[row] = from_f<__nv_bfloat16>(to_f(__ldcg(x + row)) + to_f(from_f<__nv_bfloat16>(v)));
  };

  const int ns = p.splits;
  fetch_norm(d.layers[0].attn_norm);
  pdl_wait();  // x is the previous kernel's output
  __shared__ StepInfo step;  // the consumers' barriers before the first attention publish it
  {
    const int pos = d.pos[0], seq = d.token_seq[0];
    const int n_table = min(kTableCache, min(d.max_blocks, pos / d.block_size + 1));
    for (int i = threadIdx.x; i < n_table; i += kConsumers * 32)
      step.table[i] = d.block_tables[int64_t{seq} * d.max_blocks + i];
    if (threadIdx.x == 0) step.pos = pos, step.slot = d.slots[0], step.seq = seq, step.n_table = n_table;
  }
  GridBarrier grid(barrier);  // thread 0's; its counter read after the kernels before this one are done
  for (int l = 0; l < d.n_layers; ++l) {
    const QDecoderLayer& L = d.layers[l];
    norm_to_qx();  // A
    run_jobs(p.t_qkv, p.qd, false, [&](int row, float v, float) { qkv[row] = from_f<__nv_bfloat16>(v); });
    consumers_grid_sync(grid);
    for (int it = b; it < d.n_heads * ns; it += nb) {  // B: items (head, split), a head's splits adjacent
      const int hq = it / ns, sp = it % ns;
      if (d.head_dim == 64) attend_split<2>(d, L, step, hq, sp, ns, qkv, attn, d.partials, d.counters, scratch);
      else attend_split<4>(d, L, step, hq, sp, ns, qkv, attn, d.partials, d.counters, scratch);
    }
    consumers_grid_sync(grid);
    qx_to_shared<GS>(attn, d.n_heads * d.head_dim, p.qo, qx_codes, qx_meta);  // C
    consumers_sync();
    run_jobs(p.t_o, p.qo, false, add_residual);
    fetch_norm(L.mlp_norm);
    consumers_grid_sync(grid);
    norm_to_qx();  // D
    run_jobs(p.t_ffn, p.qd, true, [&](int row, float gv, float uv) {
      const float gr = to_f(from_f<__nv_bfloat16>(gv)), ur = to_f(from_f<__nv_bfloat16>(uv));  // as stored
      h[row] = from_f<__nv_bfloat16>(act_f(gr, d.act) * ur);
    });
    consumers_grid_sync(grid);
    qx_to_shared<GS>(h, d.ffn, p.qf, qx_codes, qx_meta);  // E
    consumers_sync();
    run_jobs(p.t_dn, p.qf, false, add_residual);
    if (l + 1 < d.n_layers) {
      fetch_norm(d.layers[l + 1].attn_norm);
      consumers_grid_sync(grid);
    }
  }
#else
  __trap();  // launch_q4_decoder launches only on sm_90 and later
#endif
}

int static_smem() {
  static const int bytes = [] {
    if (smem_optin() == 0) return 0;  // no sm_90 device: the ring has no slots anyway
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, q4_decoder_kernel<__nv_bfloat16, 64>) == cudaSuccess)
      return static_cast<int>(a.sharedSizeBytes);
    cudaGetLastError();  // not sticky: cleared for the launch checks that follow
    return 1024;
  }();
  return bytes;
}

}  // namespace

bool q4_decoder_fits(const QDecoder& d, int n_sms) {
  return d.n_layers > 0 && d.n_layers <= kQDecoderMaxLayers && d.dim <= kQDecoderMaxDim && d.dim % 128 == 0 &&
         d.ffn % 128 == 0 && (d.head_dim == 64 || d.head_dim == 128) && d.n_kv_heads > 0 &&
         d.n_heads <= kQDecoderMaxHeads && d.n_heads % d.n_kv_heads == 0 && (d.n_heads * d.head_dim) % 128 == 0 &&
         plan_for(d, n_sms).slots >= 2;
}

int64_t q4_decoder_partial_floats(const QDecoder& d, int n_sms) {
  return d.n_heads * plan_for(d, n_sms).splits * (d.head_dim + 2);
}

void launch_q4_decoder(const QDecoder& d, unsigned long long* barrier, int n_sms, cudaStream_t s) {
  const DecoderPlan p = plan_for(d, n_sms);
  const unsigned grid = static_cast<unsigned>(grid_for(n_sms));
  dispatch(d.sdt, [&]<typename ST>() {
    if constexpr (sizeof(ST) == 2) {
      auto run = [&]<int GS>() {
        static const bool attr = [] {
          return cudaFuncSetAttribute(q4_decoder_kernel<ST, GS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem_optin() - static_smem()) == cudaSuccess;
        }();
        if (!attr) {
          std::fprintf(stderr, "[cuda] q4_decoder: cannot allow %d bytes of shared memory\n",
                       smem_optin() - static_smem());
          std::abort();
        }
        launch_pdl(q4_decoder_kernel<ST, GS>, grid, kThreads, static_cast<size_t>(p.smem), s, d, p, barrier);
      };
      switch (d.group_size) {
        case 32: run.template operator()<32>(); break;
        case 64: run.template operator()<64>(); break;
        default: run.template operator()<128>(); break;
      }
    }
  });
  KILN_CUDA_LAUNCH_CHECK("q4_decoder");
}

}  // namespace kiln::backend::cuda
