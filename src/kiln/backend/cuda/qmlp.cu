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

#include "kiln/backend/cuda/qring.cuh"

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

// Shared memory: [full mbarriers][empty mbarriers][red][x or h as qx: codes, meta][ring slots].
struct MlpPlan {
  int64_t dim, ffn, qd, qf;  // gate/up in (= down out), ffn; quads per row of each
  int slots;                 // per group
  int64_t qx_codes_off, qx_meta_off, ring_off, smem;
};

// The shared-memory layout for m's shapes; slots 0 where the device cannot take the kernel.
MlpPlan plan_for(const QGatedMlp& m) {
  MlpPlan p{};
  p.dim = m.gate.in, p.ffn = m.gate.out;
  p.qd = (p.dim + 127) / 128, p.qf = (p.ffn + 127) / 128;
  const int64_t qmax = std::max(p.qd, p.qf);
  p.qx_codes_off = kFixedSmem;
  p.qx_meta_off = p.qx_codes_off + qmax * 256;
  const int64_t meta_bytes = qmax * (128 / m.gate.group_size) * 8;
  p.ring_off = (p.qx_meta_off + meta_bytes + 127) / 128 * 128;
  if (m.gate.sdt != Dt::f32) p.slots = ring_slots(p.ring_off, m.gate.group_size);  // 2-byte scales only
  p.smem = p.ring_off + int64_t{kGroups} * p.slots * slot_bytes(m.gate.group_size);
  return p;
}

template <typename ST, int GS>
__global__ void __launch_bounds__(kThreads, 1)
    q4_gated_mlp_kernel(QGatedMlp m, MlpPlan p, const __nv_bfloat16* __restrict__ x, __nv_bfloat16* h, void* y,
                        Dt yt, unsigned long long* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const Ring ring = ring_at<GS>(smem, p.ring_off, p.slots);
  auto* red = partials_at(smem);  // [group][job parity][matrix: gate or down, up][warp][row]
  auto* qx_codes = reinterpret_cast<uint32_t*>(smem + p.qx_codes_off);
  auto* qx_meta = reinterpret_cast<float2*>(smem + p.qx_meta_off);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tf = (p.ffn + 15) / 16, td = (p.dim + 15) / 16, nb = gridDim.x;
  const int64_t gu0 = blockIdx.x * tf / nb, gu1 = (blockIdx.x + 1) * tf / nb;
  const int64_t dn0 = blockIdx.x * td / nb, dn1 = (blockIdx.x + 1) * td / nb;
  const int64_t pin = (p.qd + kPieceQuads - 1) / kPieceQuads, pff = (p.qf + kPieceQuads - 1) / kPieceQuads;
  ring.start();

  // Jobs in block order j = 0, 1, ...: the gate/up tile pairs, then the down tiles; job j belongs to
  // group j % kGroups, and its pieces pass through that group's ring.
  if (warp == kConsumers) {  // the producer: every piece of the block's jobs, in consumption order
    if (lane != 0) return;
    Cursor k[kGroups];  // each group's ring: where the next piece goes
    int64_t j = 0;
    for (int64_t tile = gu0; tile < gu1; ++tile, ++j)
      for (int64_t pc = 0; pc < pin; ++pc) {
        const int q = static_cast<int>(j % kGroups);
        ring.issue(q, k[q], m.gate.w, m.gate.pairs, p.qd, tile, pc);
        ring.issue(q, k[q], m.up.w, m.up.pairs, p.qd, tile, pc);
      }
    for (int64_t tile = dn0; tile < dn1; ++tile, ++j)
      for (int64_t pc = 0; pc < pff; ++pc) {
        const int q = static_cast<int>(j % kGroups);
        ring.issue(q, k[q], m.down.w, m.down.pairs, p.qf, tile, pc);
      }
    return;
  }

  // The consumers: warp gw of group grp.
  const int grp = warp / kGroupWarps, gw = warp % kGroupWarps, gt = threadIdx.x % (kGroupWarps * 32);
  pdl_wait();  // x is the previous kernel's output; h and y may still be read by earlier kernels
  Cursor k;  // the group's ring: where its next piece is
  int64_t j = 0, jg = 0;  // block jobs passed, this group's jobs done

  if (gu1 > gu0) {
    qx_to_shared<GS>(x, p.dim, p.qd, qx_codes, qx_meta);
    consumers_sync();
  }
  for (int64_t tile = gu0; tile < gu1; ++tile, ++j) {
    if (j % kGroups != grp) continue;
    float ag[2] = {0.0f, 0.0f}, au[2] = {0.0f, 0.0f};
    for (int64_t pc = 0; pc < pin; ++pc)
      ring.consume<ST, GS>(grp, gw, k, p.qd, pc, qx_codes, qx_meta, ag),
          ring.consume<ST, GS>(grp, gw, k, p.qd, pc, qx_codes, qx_meta, au);
    float(*rd)[kGroupWarps][16] = red[grp][jg++ & 1];
    put_partials(rd, gw, 0, ag), put_partials(rd, gw, 1, au);
    group_sync(grp);
    const int64_t row = tile * 16 + gt;
    if (gt < 16 && row < p.ffn) {
      const float gv = sum_partials(rd, 0, gt), uv = sum_partials(rd, 1, gt);
      const float gr = to_f(from_f<__nv_bfloat16>(gv)), ur = to_f(from_f<__nv_bfloat16>(uv));  // gate / up as stored
      h[row] = from_f<__nv_bfloat16>(act_f(gr, m.act) * ur);
    }
  }

  consumers_sync();  // this block's h is written
  if (threadIdx.x == 0) GridBarrier(barrier).arrive(dn1 > dn0);
  if (dn1 == dn0) return;
  consumers_sync();
  qx_to_shared<GS>(h, p.ffn, p.qf, qx_codes, qx_meta);
  consumers_sync();
  for (int64_t tile = dn0; tile < dn1; ++tile, ++j) {
    if (j % kGroups != grp) continue;
    float ad[2] = {0.0f, 0.0f};
    for (int64_t pc = 0; pc < pff; ++pc) ring.consume<ST, GS>(grp, gw, k, p.qf, pc, qx_codes, qx_meta, ad);
    float(*rd)[kGroupWarps][16] = red[grp][jg++ & 1];
    put_partials(rd, gw, 0, ad);
    group_sync(grp);
    const int64_t row = tile * 16 + gt;
    if (gt < 16 && row < p.dim) store_s(y, yt, row, sum_partials(rd, 0, gt));
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
                                      qring::smem_optin()) == cudaSuccess;
        }();
        if (!attr) {
          std::fprintf(stderr, "[cuda] q4_gated_mlp: cannot allow %d bytes of shared memory\n", qring::smem_optin());
          std::abort();
        }
        launch_pdl(q4_gated_mlp_kernel<ST, GS>, grid, qring::kThreads, static_cast<size_t>(p.smem), s, m, p,
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
