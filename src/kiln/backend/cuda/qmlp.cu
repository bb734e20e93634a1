// The gated MLP of one decode token in one persistent launch (qkernels.h: launch_q4_gated_mlp):
// gate/up GEMV, activation, a grid barrier, down GEMV. Separate kernels leave DRAM idle from each
// GEMV's last wave to the next GEMV's first loads (the activation kernel and two handoffs between);
// here a producer warp per block streams the block's tiles of all three matrices, in the order they
// are used, into a ring of shared-memory slots with TMA bulk copies, while the block's other warps
// compute: the down weights keep arriving while the block waits at the barrier for everyone's h.
//
// Block b of nb (one per SM) owns gate/up tiles [b Tf / nb, (b + 1) Tf / nb) and down tiles
// [b Td / nb, (b + 1) Td / nb) (16-row tiles of the 4-bit tiled layout, qmatmul.cu). A job is one
// tile pair of gate/up (then 16 values of h) or one down tile (16 values of y); jobs alternate
// between two groups of 8 consumer warps, each with its own ring; a job's quads pass through the
// ring in pieces of up to kPieceQuads quads (codes and the pairs of those quads, two bulk copies),
// gate and up pieces interleaved. Warp w of a group takes quads w, w + 8 of every piece, so all of
// them work on each piece; the partial sums meet in a fixed order (the same bits on every run; not
// those of the separate ops, whose warps take contiguous quad ranges).
//
// Not faster in the model yet, so off by default (CudaBackend::set_fused_mlp; BENCHMARKS.md,
// thirteenth session): llama-3-8b's MLP alone takes 38.8 µs against 42.0 for the separate ops, but
// batch-1 decode is no faster (median 404.5 against 413.4 tok/s, within the spread). The eleventh
// session's version (each warp playing one warp of the separate GEMV, so a piece fed one or two
// warps) took 43.2 µs. Per-block timestamps of this one (µs from the first block's entry): x's qx
// 1.7, gate/up done 16.9 (mean) / 18.9 (last block), barrier passed 21.5, h's qx 24.8 (one L2 round
// trip under the ring's traffic), producer done issuing 27.9, down done 30.8 / 31.3.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kiln/backend/cuda/common.cuh"
#include "kiln/backend/cuda/q4mma.cuh"
#include "kiln/backend/cuda/qkernels.h"
#include "kiln/backend/cuda/qx.cuh"

namespace kiln::backend::cuda {

namespace {

constexpr int kGroups = 2, kGroupWarps = 8;          // consumer groups (a job each at a time) of 8 warps
constexpr int kConsumers = kGroups * kGroupWarps;    // compute warps per block
constexpr int kThreads = (kConsumers + 1) * 32;      // and one producer warp
constexpr int kPieceQuads = 16;                      // quads per ring slot (16 KB of codes)
constexpr int kMaxSlots = 12;                        // both groups' rings
constexpr int kFixedSmem = 2 * kMaxSlots * 8 + kGroups * 2 * 2 * kGroupWarps * 16 * 4;  // mbarriers, partial sums

// Shared memory: [full mbarriers][empty mbarriers][red][x or h as qx: codes, meta][ring slots].
struct MlpPlan {
  int64_t dim, ffn, qd, qf;  // gate/up in (= down out), ffn; quads per row of each
  int slots, slot_bytes, pair_quad_bytes;  // slots: per group
  int64_t qx_codes_off, qx_meta_off, ring_off, smem;
};

int smem_optin() {
  static const int v = [] {
    int dev = 0, bytes = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return major >= 9 ? bytes : 0;  // TMA bulk copies and mbarrier tx counts: sm_90
  }();
  return v;
}

// The shared-memory layout for m's shapes; slots 0 where the device cannot take the kernel.
MlpPlan plan_for(const QGatedMlp& m) {
  MlpPlan p{};
  const int pair_words = 128 / m.gate.group_size;  // 2-byte scales (f32 ones are not planned)
  p.dim = m.gate.in, p.ffn = m.gate.out;
  p.qd = (p.dim + 127) / 128, p.qf = (p.ffn + 127) / 128;
  const int64_t qmax = std::max(p.qd, p.qf);
  p.pair_quad_bytes = 16 * pair_words * 4;
  p.slot_bytes = kPieceQuads * (1024 + p.pair_quad_bytes);
  p.qx_codes_off = kFixedSmem;
  p.qx_meta_off = p.qx_codes_off + qmax * 256;
  const int64_t meta_bytes = qmax * (128 / m.gate.group_size) * 8;
  p.ring_off = (p.qx_meta_off + meta_bytes + 127) / 128 * 128;
  if (m.gate.sdt != Dt::f32 && smem_optin() > p.ring_off)
    p.slots = static_cast<int>(std::min<int64_t>(kMaxSlots, (smem_optin() - p.ring_off) / p.slot_bytes) / kGroups);
  p.smem = p.ring_off + int64_t{kGroups} * p.slots * p.slot_bytes;
  return p;
}

// ---- sm_90 mbarriers and bulk copies (shared::cta addresses)
__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(b)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(saddr(b)), "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   saddr(dst)),
               "l"(src), "r"(bytes), "r"(saddr(b))
               : "memory");
}

// The consumer warps' barriers (the producer warp never joins them): all of them, or one group's.
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory"); }
__device__ __forceinline__ void group_sync(int grp) {
  static_assert(kGroups == 2, "one named barrier per group");
  if (grp == 0) asm volatile("bar.sync 2, %0;" ::"n"(kGroupWarps * 32) : "memory");
  else asm volatile("bar.sync 3, %0;" ::"n"(kGroupWarps * 32) : "memory");
}

// All blocks of the grid: ctr[gridDim.x] counts arrivals at every barrier of every launch of this
// grid size, so each launch finds it at a multiple of the size (launches never overlap here: each
// waits for the previous kernel first). Called by one thread per block, after a block barrier over
// the writes it publishes.
__device__ void grid_barrier(unsigned long long* ctr, bool wait) {
  unsigned long long* c = ctr + gridDim.x;
  __threadfence();
  const unsigned long long target = (atomicAdd(c, 1ull) / gridDim.x + 1) * gridDim.x;
  if (wait) {
    unsigned long long v;
    do asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(c) : "memory");
    while (v < target);
  }
  __threadfence();
}

// A bf16 row of `cols` (written by this launch's other blocks or by earlier kernels: read through
// L2) as qx for one token into shared memory: codes [units][16 words], meta [groups] (d, S) — the
// bits qx_store4 writes for the separate GEMV. Every consumer thread; units * 8 slots are whole warps.
template <int GS>
__device__ void qx_to_shared(const __nv_bfloat16* src, int64_t cols, int64_t quads, uint32_t* codes, float2* meta) {
  constexpr int kBatch = 8;  // slots per thread whose loads are in flight together
  constexpr int kStride = kConsumers * 32;
  const int64_t n_slots = quads * 32;
  for (int64_t base = threadIdx.x; base < n_slots; base += kBatch * kStride) {
    uint2 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t col = (base + b * kStride) * 4;
      v[b] = base + b * kStride < n_slots && col < cols ? __ldcg(reinterpret_cast<const uint2*>(src + col))
                                                         : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t col = (base + b * kStride) * 4;
      if (base + b * kStride >= n_slots) break;  // the same for a whole warp
      float f[4];
      bf16x4_to_f(v[b], f);
      uint32_t hi, lo;
      float2 dS;
      qx_encode4<GS>(f, hi, lo, dS);
      qx_put_codes(codes + (col / 32) * 16, col, hi, lo);
      if (col % GS == 0) meta[col / GS] = dS;
    }
  }
}

template <typename ST, int GS>
__global__ void __launch_bounds__(kThreads, 1)
    q4_gated_mlp_kernel(QGatedMlp m, MlpPlan p, const __nv_bfloat16* __restrict__ x, __nv_bfloat16* h, void* y,
                        Dt yt, unsigned long long* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int GPQ = 128 / GS, PW = q4_pair_words<ST, GS>();
  extern __shared__ __align__(128) unsigned char smem[];
  auto* full = reinterpret_cast<uint64_t*>(smem);  // [group][slot]
  uint64_t* empty = full + kMaxSlots;
  // Partial sums [group][job parity][matrix: gate or down, up][virtual warp][row].
  auto* red = reinterpret_cast<float(*)[2][2][kGroupWarps][16]>(smem + 2 * kMaxSlots * 8);
  auto* qx_codes = reinterpret_cast<uint32_t*>(smem + p.qx_codes_off);
  auto* qx_meta = reinterpret_cast<float2*>(smem + p.qx_meta_off);
  unsigned char* ring = smem + p.ring_off;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t tf = (p.ffn + 15) / 16, td = (p.dim + 15) / 16, nb = gridDim.x;
  const int64_t gu0 = blockIdx.x * tf / nb, gu1 = (blockIdx.x + 1) * tf / nb;
  const int64_t dn0 = blockIdx.x * td / nb, dn1 = (blockIdx.x + 1) * td / nb;
  const int64_t pin = (p.qd + kPieceQuads - 1) / kPieceQuads, pff = (p.qf + kPieceQuads - 1) / kPieceQuads;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kGroups * p.slots; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], kGroupWarps);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  pdl_trigger();

  // Jobs in block order j = 0, 1, ...: the gate/up tile pairs, then the down tiles; job j belongs to
  // group j % kGroups, and its pieces pass through that group's ring.
  if (warp == kConsumers) {  // the producer: every piece of the block's jobs, in consumption order
    if (lane != 0) return;
    uint32_t k0 = 0, k1 = 0;  // pieces issued to each group's ring
    auto issue_to = [&](uint32_t& k, int q, const QWeightArgs& w, int64_t Q, int64_t tile, int64_t pc) {
      const int s = q * p.slots + static_cast<int>(k % p.slots);
      const uint32_t use = k / p.slots;
      if (use > 0) mbar_wait(&empty[s], (use - 1) & 1);
      const int64_t q0 = pc * kPieceQuads, nq = Q - q0 < kPieceQuads ? Q - q0 : kPieceQuads;
      const unsigned cb = static_cast<unsigned>(nq * 1024), pb = static_cast<unsigned>(nq * p.pair_quad_bytes);
      unsigned char* slot = ring + int64_t{s} * p.slot_bytes;
      mbar_arrive_tx(&full[s], cb + pb);
      bulk_copy(slot, reinterpret_cast<const char*>(w.w) + (tile * Q + q0) * 1024, cb, &full[s]);
      bulk_copy(slot + kPieceQuads * 1024, static_cast<const char*>(w.pairs) + (tile * Q + q0) * p.pair_quad_bytes,
                pb, &full[s]);
      ++k;
    };
    auto issue = [&](int q, const QWeightArgs& w, int64_t Q, int64_t tile, int64_t pc) {
      if (q == 0) issue_to(k0, 0, w, Q, tile, pc);
      else issue_to(k1, 1, w, Q, tile, pc);
    };
    int64_t j = 0;
    for (int64_t tile = gu0; tile < gu1; ++tile, ++j)
      for (int64_t pc = 0; pc < pin; ++pc)
        issue(j % kGroups, m.gate, p.qd, tile, pc), issue(j % kGroups, m.up, p.qd, tile, pc);
    for (int64_t tile = dn0; tile < dn1; ++tile, ++j)
      for (int64_t pc = 0; pc < pff; ++pc) issue(j % kGroups, m.down, p.qf, tile, pc);
    return;
  }

  // The consumers: warp gw of group grp.
  const int grp = warp / kGroupWarps, gw = warp % kGroupWarps, gt = threadIdx.x % (kGroupWarps * 32);
  pdl_wait();  // x is the previous kernel's output; h and y may still be read by earlier kernels
  uint32_t k = 0;  // pieces this group consumed
  // Piece pc (quads [q0, q1) of a tile of Q quads per row) into acc: quads q0 + gw, q0 + gw + 8, ...
  // of it, so that every warp of the group works on every piece.
  auto consume = [&](int64_t Q, int64_t pc, float (&acc)[4]) {
    const int s = grp * p.slots + static_cast<int>(k % p.slots);
    mbar_wait(&full[s], (k / p.slots) & 1);
    const int64_t q0 = pc * kPieceQuads, q1 = Q < q0 + kPieceQuads ? Q : q0 + kPieceQuads;
    const auto* codes = reinterpret_cast<const uint4*>(ring + int64_t{s} * p.slot_bytes);
    const auto* pairs = reinterpret_cast<const uint32_t*>(ring + int64_t{s} * p.slot_bytes + kPieceQuads * 1024);
    const auto* xq = reinterpret_cast<const uint4*>(qx_codes) + q0 * 16 + t;
    const float2* mq = qx_meta + q0 * GPQ;
    const int hi = static_cast<int>(q1 - q0);
#pragma unroll 1
    for (int i = gw; i < hi; i += kGroupWarps) {
      const uint4* c = codes + i * 64;
      const uint32_t* pp = pairs + i * 16 * PW;
      uint32_t pl[PW], ph[PW];
#pragma unroll
      for (int x = 0; x < PW; ++x) pl[x] = pp[g * PW + x], ph[x] = pp[(8 + g) * PW + x];
      uint4 xv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) xv[u] = g == 0 ? xq[(4 * i + u) * 4] : make_uint4(0u, 0u, 0u, 0u);
      q4_quad_mma<ST, GS>(
          acc, c[lane], c[32 + lane], pl, ph, xv,
          [&](int gi) {
            const float2 d = mq[i * GPQ + gi];
            return make_float4(d.x, d.y, 0.0f, 0.0f);
          },
          false);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    ++k;
  };
  int64_t j = 0, jg = 0;  // block jobs passed, this group's jobs done

  if (gu1 > gu0) {
    qx_to_shared<GS>(x, p.dim, p.qd, qx_codes, qx_meta);
    consumers_sync();
  }
  for (int64_t tile = gu0; tile < gu1; ++tile, ++j) {
    if (j % kGroups != grp) continue;
    float ag[4] = {0.0f, 0.0f, 0.0f, 0.0f}, au[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t pc = 0; pc < pin; ++pc) consume(p.qd, pc, ag), consume(p.qd, pc, au);
    float(*rd)[kGroupWarps][16] = red[grp][jg++ & 1];
    if (t == 0) {
      rd[0][gw][g] = ag[0], rd[0][gw][g + 8] = ag[2];
      rd[1][gw][g] = au[0], rd[1][gw][g + 8] = au[2];
    }
    group_sync(grp);
    const int64_t row = tile * 16 + gt;
    if (gt < 16 && row < p.ffn) {
      float gv = 0.0f, uv = 0.0f;
      for (int w = 0; w < kGroupWarps; ++w) gv += rd[0][w][gt], uv += rd[1][w][gt];
      const float gr = to_f(from_f<__nv_bfloat16>(gv)), ur = to_f(from_f<__nv_bfloat16>(uv));  // gate / up as stored
      h[row] = from_f<__nv_bfloat16>(act_f(gr, m.act) * ur);
    }
  }

  consumers_sync();  // this block's h is written
  if (threadIdx.x == 0) grid_barrier(barrier, dn1 > dn0);
  if (dn1 == dn0) return;
  consumers_sync();
  qx_to_shared<GS>(h, p.ffn, p.qf, qx_codes, qx_meta);
  consumers_sync();
  for (int64_t tile = dn0; tile < dn1; ++tile, ++j) {
    if (j % kGroups != grp) continue;
    float ad[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t pc = 0; pc < pff; ++pc) consume(p.qf, pc, ad);
    float(*rd)[kGroupWarps][16] = red[grp][jg++ & 1];
    if (t == 0) rd[0][gw][g] = ad[0], rd[0][gw][g + 8] = ad[2];
    group_sync(grp);
    const int64_t row = tile * 16 + gt;
    if (gt < 16 && row < p.dim) {
      float v = 0.0f;
      for (int w = 0; w < kGroupWarps; ++w) v += rd[0][w][gt];
      store_s(y, yt, row, v);
    }
  }
#else
  __trap();  // launch_q4_gated_mlp launches only on sm_90 and later
#endif
}

}  // namespace

bool q4_gated_mlp_fits(const QGatedMlp& m) { return plan_for(m).slots >= 2; }

void launch_q4_gated_mlp(const QGatedMlp& m, const void* x, void* h, void* y, Dt yt, unsigned long long* barrier,
                         int n_sms, cudaStream_t s) {
  const MlpPlan p = plan_for(m);
  const int64_t tf = (p.ffn + 15) / 16, td = (p.dim + 15) / 16;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>({n_sms, kQGatedMlpMaxGrid, std::max(tf, td)}));
  dispatch(m.gate.sdt, [&]<typename ST>() {
    if constexpr (sizeof(ST) == 2) {
      auto run = [&]<int GS>() {
        static const bool attr = [] {
          return cudaFuncSetAttribute(q4_gated_mlp_kernel<ST, GS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem_optin()) == cudaSuccess;
        }();
        if (!attr) {
          std::fprintf(stderr, "[cuda] q4_gated_mlp: cannot allow %d bytes of shared memory\n", smem_optin());
          std::abort();
        }
        launch_pdl(q4_gated_mlp_kernel<ST, GS>, grid, kThreads, static_cast<size_t>(p.smem), s, m, p,
                   static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(h), y, yt, barrier);
      };
      switch (m.gate.group_size) {
        case 32: run.template operator()<32>(); break;
        case 64: run.template operator()<64>(); break;
        default: run.template operator()<128>(); break;
      }
    }
  });
  KILN_CUDA_LAUNCH_CHECK("q4_gated_mlp");
}

}  // namespace kiln::backend::cuda
