// The machinery of the persistent 4-bit kernel that streams its weights through shared memory
// (qdecoder.cu: a whole decoder stack): one block per SM, a producer warp copying the block's weight
// pieces in consumption order into a ring of shared-memory slots with TMA bulk copies, and two groups
// of 8 consumer warps, each with its own ring, taking halves of a phase's pieces. A piece is up to kPieceQuads
// quads of one tile: its codes, then its (scale, bias) pairs (the 4-bit tiled layout of qmatmul.cu).
// sm_90 and later (mbarrier tx counts, bulk copies); the host side plans for 0 slots elsewhere.
#pragma once
#include <cstdint>

#include "kiln/backend/cuda/core/common.cuh"
#include "kiln/backend/cuda/quant/q4mma.cuh"
#include "kiln/backend/cuda/quant/qkernels.h"
#include "kiln/backend/cuda/quant/qx.cuh"

namespace kiln::backend::cuda::qring {

constexpr int kGroups = 2, kGroupWarps = 8;        // consumer groups (a job each at a time) of 8 warps
constexpr int kConsumers = kGroups * kGroupWarps;  // compute warps per block
constexpr int kThreads = (kConsumers + 1) * 32;    // and one producer warp
constexpr int kPieceQuads = 16;                    // quads per ring slot (16 KB of codes)
constexpr int kMaxSlots = 12;                      // both groups' rings
// mbarriers (full, empty) and the partial sums [group][buffer: job parity, or a tile the groups
// share][2 matrices][warp][row].
constexpr int kFixedSmem = 2 * kMaxSlots * 8 + kGroups * 3 * 2 * kGroupWarps * 16 * 4;

// The opt-in shared memory per block on sm_90 and later, else 0.
int smem_optin();
// Bytes of one ring slot for group size gs (2-byte scales) and the pair bytes per quad.
__host__ __device__ constexpr int pair_quad_bytes(int gs) { return 16 * (128 / gs) * 4; }
__host__ __device__ constexpr int slot_bytes(int gs) { return kPieceQuads * (1024 + pair_quad_bytes(gs)); }
// Slots per group that fit after `ring_off` bytes of other shared memory (0: the kernel cannot run).
inline int ring_slots(int64_t ring_off, int gs) {
  const int64_t room = smem_optin() - ring_off;
  if (room <= 0) return 0;
  const int64_t s = room / slot_bytes(gs);
  return static_cast<int>((s < kMaxSlots ? s : kMaxSlots) / kGroups);
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
// A bulk copy with an L2 cache policy (evict_first_policy: the streamed weights go first, so that they
// do not push out the activations, caches and partial sums the kernel reads back).
__device__ __forceinline__ void bulk_copy_hint(void* dst, const void* src, unsigned bytes, uint64_t* b,
                                               uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
      ::"r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(b)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// The consumer warps' barriers (the producer warp never joins them): all of them, or one group's.
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory"); }
__device__ __forceinline__ void group_sync(int grp) {
  static_assert(kGroups == 2, "one named barrier per group");
  if (grp == 0) asm volatile("bar.sync 2, %0;" ::"n"(kGroupWarps * 32) : "memory");
  else asm volatile("bar.sync 3, %0;" ::"n"(kGroupWarps * 32) : "memory");
}

// All blocks of the grid, one thread of each (after a block barrier over the writes it publishes):
// ctr[gridDim.x] counts arrivals at every barrier of every launch of this grid size, so each launch
// finds it at a multiple of the size (launches never overlap here: each waits for the previous kernel
// first, and completes every barrier it begins). The thread keeps the count that completes its next
// barrier (from the counter's value before its first arrival) and arrives with a release reduction,
// which does not wait for an answer (a fence and an atomicAdd's round trip sat on the last block's
// path: BENCHMARKS.md, fifteenth session); the wait is an acquire poll.
struct GridBarrier {
  unsigned long long* c;
  unsigned long long target;
  __device__ explicit GridBarrier(unsigned long long* ctr) : c(ctr + gridDim.x) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(c) : "memory");
    target = (v / gridDim.x + 1) * gridDim.x;
  }
  __device__ void arrive(bool wait) {
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(c) : "memory");
    if (wait) {
      unsigned long long v;
      do asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(c) : "memory");
      while (v < target);
    }
    target += gridDim.x;
  }
};
// Every consumer thread: the grid barrier (gb: thread 0's), with this block's writes before it
// published and the other blocks' visible after it.
__device__ __forceinline__ void consumers_grid_sync(GridBarrier& gb) {
  consumers_sync();
  if (threadIdx.x == 0) gb.arrive(true);
  consumers_sync();
}

// The qx of slots base + b kConsumers 32 (b < kB; 8 columns each, while below n_slots) of one token
// into shared memory: codes [units][16 words], meta [groups] (d, S) — the bits qx_store4 writes for
// the separate GEMV. v[b]: the slot's 8 bf16; map(col, f) may change its 8 values first. Every
// consumer thread (whole warps: a warp past n_slots stops, one part past encodes zeros unstored).
template <int GS, int kB, typename Map>
__device__ __forceinline__ void qx_encode_slots(const uint4 (&v)[kB], int base, int n_slots, uint32_t* codes,
                                                float2* meta, Map map) {
#pragma unroll
  for (int b = 0; b < kB; ++b) {
    const int slot = base + b * kConsumers * 32, col = slot * 8;
    if ((slot & ~31) >= n_slots) break;  // the same for a whole warp
    float f[8];
    bf16x8_to_f(v[b], f);
    if (slot < n_slots) map(col, f);
    uint32_t hi[2], lo[2];
    float2 dS;
    qx_encode<GS>(f, hi, lo, dS);
    if (slot >= n_slots) continue;
    uint32_t* unit = codes + (col / 32) * 16;
    qx_put_codes(unit, col % 32, hi[0], lo[0]);
    qx_put_codes(unit, col % 32 + 4, hi[1], lo[1]);
    if (col % GS == 0) meta[col / GS] = dS;
  }
}

// A bf16 row of `cols` (written by this launch's other blocks or by earlier kernels: read through
// L2) as qx for one token into shared memory, `quads` quads of it (zeros past cols).
template <int GS>
__device__ void qx_to_shared(const __nv_bfloat16* src, int64_t cols, int64_t quads, uint32_t* codes, float2* meta) {
  constexpr int kBatch = 4;  // slots per thread whose loads are in flight together
  constexpr int kStride = kConsumers * 32;
  const int n_slots = static_cast<int>(quads * 16), n_cols = static_cast<int>(cols);
  // The loop's test is the warp's first slot: n_slots (quads * 16) need not be whole warps, and the
  // encoder's shuffles need every lane.
  for (int base = threadIdx.x; (base & ~31) < n_slots; base += kBatch * kStride) {
    uint4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int slot = base + b * kStride;
      v[b] = slot < n_slots && slot * 8 < n_cols ? __ldcg(reinterpret_cast<const uint4*>(src) + slot)
                                                 : make_uint4(0u, 0u, 0u, 0u);
    }
    qx_encode_slots<GS>(v, base, n_slots, codes, meta, [](int, float(&)[8]) {});
  }
}

// A position in one group's ring: the slot and how many times the ring came round before (its
// mbarriers' phase parity), kept by counting rather than dividing a piece count by the slots (a
// runtime division before every piece's wait).
struct Cursor {
  int slot = 0;
  uint32_t lap = 0;
  __device__ void advance(int slots) {
    if (++slot == slots) slot = 0, ++lap;
  }
};

// A block's view of its ring: full / empty mbarriers [group][slot], the slots after `base`.
struct Ring {
  uint64_t* full;
  uint64_t* empty;
  unsigned char* base;
  int slots, slot_bytes, pair_quad_bytes;

  // Every thread of the block at the kernel's start: the mbarriers initialized and visible, then the
  // next PDL kernel allowed to launch.
  __device__ void start() const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kGroups * slots; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], kGroupWarps);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    pdl_trigger();
  }
  // The producer: piece pc of tile `tile` of matrix (codes, pairs) with Q quads per row into group
  // grp's ring at cursor k. The copies evict first from L2, so
  // that the streamed weights do not push out the activations, caches and partial sums the kernel
  // reads back (BENCHMARKS.md, fourteenth session: h's read back after ~60 MB of weights went
  // 5.1 -> 3.4 µs, a decoder layer 73 -> 61 µs).
  __device__ void issue(int grp, Cursor& k, const void* codes, const void* pairs, int64_t Q, int64_t tile,
                        int64_t pc) const {
    const int s = grp * slots + k.slot;
    if (k.lap > 0) mbar_wait(&empty[s], (k.lap - 1) & 1);
    const int64_t q0 = pc * kPieceQuads, nq = Q - q0 < kPieceQuads ? Q - q0 : kPieceQuads;
    const unsigned cb = static_cast<unsigned>(nq * 1024), pb = static_cast<unsigned>(nq * pair_quad_bytes);
    unsigned char* slot = base + int64_t{s} * slot_bytes;
    mbar_arrive_tx(&full[s], cb + pb);
    const char* c = static_cast<const char*>(codes) + (tile * Q + q0) * 1024;
    const char* pp = static_cast<const char*>(pairs) + (tile * Q + q0) * pair_quad_bytes;
    const uint64_t policy = evict_first_policy();
    bulk_copy_hint(slot, c, cb, &full[s], policy);
    bulk_copy_hint(slot + kPieceQuads * 1024, pp, pb, &full[s], policy);
    k.advance(slots);
  }

  // Consumer warp gw of group grp: the piece at cursor k (piece pc of a tile of Q quads per row) into acc
  // (q4_quad_mma_packed's layout; rows g, g + 8 in lanes t = 0) against the token's qx in shared
  // memory: quads gw, gw + 8, ... of the piece, so that every warp of the group works on every piece.
  // Every lane loads a B fragment (lanes g >= 2 the same words as g & 1: their C columns 2..7 land in
  // lanes t > 0, which nobody reads), so the loop has no predicated loads and no zero moves.
  template <typename ST, int GS>
  __device__ void consume(int grp, int gw, Cursor& k, int Q, int pc, const uint32_t* qx_codes,
                          const float2* qx_meta, float (&acc)[2]) const {
    constexpr int GPQ = 128 / GS, PW = q4_pair_words<ST, GS>();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int s = grp * slots + k.slot;
    mbar_wait(&full[s], k.lap & 1);
    const int q0 = pc * kPieceQuads, n = Q - q0 < kPieceQuads ? Q - q0 : kPieceQuads;
    const unsigned char* slot = base + s * slot_bytes;
    // Quad gw's words; a step of kGroupWarps quads after each.
    const uint4* c = reinterpret_cast<const uint4*>(slot) + gw * 64 + lane;
    const uint32_t* pp = reinterpret_cast<const uint32_t*>(slot + kPieceQuads * 1024) + (gw * 16 + g) * PW;
    const uint2* xq = reinterpret_cast<const uint2*>(qx_codes) + (q0 + gw) * 32 + 2 * t + (g & 1);  // B: hi, lo
    const float2* mq = qx_meta + (q0 + gw) * GPQ;
#pragma unroll 1
    for (int i = gw; i < n; i += kGroupWarps) {
      uint32_t pl[PW], ph[PW];
#pragma unroll
      for (int x = 0; x < PW; ++x) pl[x] = pp[x], ph[x] = pp[8 * PW + x];
      uint2 xv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) xv[u] = xq[u * 8];
      q4_quad_mma_packed<ST, GS>(acc, c[0], c[32], pl, ph, xv, [&](int gi) { return mq[gi]; });
      c += kGroupWarps * 64, pp += kGroupWarps * 16 * PW, xq += kGroupWarps * 32, mq += kGroupWarps * GPQ;
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    k.advance(slots);
  }
};

// The ring and partial sums at the start of a kernel's dynamic shared memory: [full mbarriers][empty
// mbarriers][partial sums] (kFixedSmem bytes), the ring's slots at ring_off.
template <int GS>
__device__ __forceinline__ Ring ring_at(unsigned char* smem, int64_t ring_off, int slots) {
  return Ring{reinterpret_cast<uint64_t*>(smem), reinterpret_cast<uint64_t*>(smem) + kMaxSlots, smem + ring_off, slots,
              slot_bytes(GS), pair_quad_bytes(GS)};
}
// Partial sums [group][buffer][matrix][warp][row] (put_partials / sum_partials): buffers 0, 1 alternate
// between a group's jobs, 2 holds its part of a tile both groups work on.
__device__ __forceinline__ auto partials_at(unsigned char* smem) {
  return reinterpret_cast<float(*)[3][2][kGroupWarps][16]>(smem + 2 * kMaxSlots * 8);
}

// Rows [16 tile, 16 tile + 16) of a group's job: thread gt (< 16) of the group gets the sum over the
// group's warps of row gt's partials, in warp order (the same bits on every run). red: this job's
// [2][kGroupWarps][16] partial buffer (alternate two per group so that the next job's writes
// cannot race this one's reads). m: which of the two matrices' partials.
__device__ __forceinline__ void put_partials(float (*rd)[kGroupWarps][16], int gw, int m, const float (&acc)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if (t == 0) rd[m][gw][g] = acc[0], rd[m][gw][g + 8] = acc[1];
}
__device__ __forceinline__ float sum_partials(float (*rd)[kGroupWarps][16], int m, int gt) {
  float v = 0.0f;
  for (int w = 0; w < kGroupWarps; ++w) v += rd[m][w][gt];
  return v;
}

}  // namespace kiln::backend::cuda::qring
