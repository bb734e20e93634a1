// Per-block timestamps of the decode kernels, for a probe build only (cmake -DKILN_CUDA_STAMPS=ON;
// otherwise core/probe_hooks.h defines the macros as nothing and never includes this file). With KILN_CUDA_STAMPS=FILE in
// the environment, thread 0 of every block of a kernel that opens a KILN_STAMP_SCOPE records
// %globaltimer (ns, one clock for all SMs) at
//   0  kernel entry                      1  its first pdl_wait() returned (griddepcontrol released)
//   2  a point the kernel marks (KILN_STAMP(2)): the 4-bit GEMV's warp 0 done with its K range,
//      add_rms_norm's sum of squares known, the tiled attention's warp 0 done with its tiles
//   3  exit (the scope's end: after the block's last store as thread 0 sees it)
// with its SM, block and grid; FILE gets the records at process exit, and bench/stamp_timeline.py
// turns them into per-launch spans and hand-offs (what a kernel trace of start/end cannot show: when
// the blocks were released from their PDL wait, and how long each took after it).
// Cost: one atomic per block at entry (thread 0 only) and four shared-memory stores; measured against
// the same binary with the variable unset in BENCHMARKS.md.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::backend::cuda {

enum StampSite : uint32_t {
  kStampQGemv4 = 1,  // qgemv4_tc_kernel
  kStampAddRmsNorm,  // add_rms_norm_kernel
  kStampRopeKv,      // rope_kv_write_kernel
  kStampAttnTiled,   // the tiled decode attention
  kStampAttnDecode,  // the generic decode attention
  kStampAttnCombine,
  kStampGatedAct,  // gated_act_qx_kernel
  kStampQuantizeX,
};

struct StampRec {  // 48 bytes, the file's record
  uint32_t site, block, grid, smid;
  unsigned long long t[4];
};
struct StampBuf {
  StampRec* rec;    // [SM][per_sm]
  unsigned* count;  // [SM]: records taken (may pass per_sm: those are dropped)
  unsigned per_sm;
};

// Host: every translation unit's copy of g_stamps registers its setter; stamps_start() (the backend's
// constructor, KILN_STAMPS_START) allocates the records when KILN_CUDA_STAMPS names a file and sets
// every copy.
bool stamps_register(void (*set)(const StampBuf&));

namespace {
__device__ StampBuf g_stamps;  // one per translation unit (no separate compilation)
void stamps_set(const StampBuf& b) { cudaMemcpyToSymbol(g_stamps, &b, sizeof b); }
const bool g_stamps_registered = stamps_register(stamps_set);
}  // namespace

__device__ __forceinline__ unsigned long long stamp_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ bool stamp_thread() { return threadIdx.x == 0; }  // the kernels' blocks are 1-D
// Thread 0's stamps of this block: entry, marks 1 and 2, then the record's index (~0: off or full).
__device__ __forceinline__ unsigned long long* stamp_shared() {
  __shared__ unsigned long long s[4];
  return s;
}
// Marks keep the timer's low 32 bits, the earliest by a shared-memory atomic min (a 64-bit
// read-compare-write inside the GEMV's loop spilled registers); the exit widens them from the
// entry's 64 bits (a kernel is far shorter than the 4 s the low bits span).
__device__ __forceinline__ void stamp_mark(int k) {
  if (!stamp_thread()) return;
  unsigned t;
  asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(t));
  atomicMin(reinterpret_cast<unsigned*>(stamp_shared() + k), t);
}
__device__ __forceinline__ unsigned long long stamp_widen(unsigned long long t0, unsigned long long lo) {
  if (lo == 0xffffffffull) return 0;  // not marked
  const unsigned long long t = (t0 & ~0xffffffffull) | lo;
  return t < t0 ? t + (1ull << 32) : t;
}

struct StampScope {
  uint32_t site;
  __device__ explicit StampScope(uint32_t site_) : site(site_) {
    if (!stamp_thread()) return;
    unsigned long long* s = stamp_shared();
    s[0] = stamp_now();
    s[1] = s[2] = 0xffffffffull;  // the marks' atomic min (low 32 bits)
    s[3] = ~0ull;
    if (g_stamps.rec) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      const unsigned i = atomicAdd(g_stamps.count + sm, 1u);
      if (i < g_stamps.per_sm) s[3] = static_cast<unsigned long long>(sm) * g_stamps.per_sm + i;
    }
  }
  __device__ ~StampScope() {
    if (!stamp_thread()) return;
    const unsigned long long* s = stamp_shared();
    if (s[3] == ~0ull) return;
    StampRec& r = g_stamps.rec[s[3]];
    r.site = site;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.grid = gridDim.x * gridDim.y * gridDim.z;
    r.smid = static_cast<uint32_t>(s[3] / g_stamps.per_sm);
    r.t[0] = s[0];
    r.t[1] = stamp_widen(s[0], s[1]);
    r.t[2] = stamp_widen(s[0], s[2]);
    r.t[3] = stamp_now();
  }
};

}  // namespace kiln::backend::cuda

#define KILN_STAMP_SCOPE(site) ::kiln::backend::cuda::StampScope kiln_stamp_scope_(site)
#define KILN_STAMP(k) ::kiln::backend::cuda::stamp_mark(k)
