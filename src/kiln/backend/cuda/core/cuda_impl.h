// CudaBackend's private state, shared by cuda_backend.cpp (buffers, arena, graphs, weights) and
// cuda_ops.cpp (op validation and dispatch, cuBLASLt). Host code only; kernels are in the .cu files.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backend/cuda/cuda_backend.h"
#include "kiln/backend/cuda/core/kernels.h"
#include "kiln/backend/cuda/core/options.h"

namespace kiln::backend::cuda {

// Names the failed call and its error; device errors are not recoverable, bad input never gets here.
#define CUDA_CHECK(call)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) ::kiln::fail("cuda", "{} failed: {} ({}:{})", #call, cudaGetErrorString(e_), \
                                        __FILE__, __LINE__);                                      \
  } while (0)
#define CUBLAS_CHECK(call)                                                                             \
  do {                                                                                                 \
    cublasStatus_t s_ = (call);                                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) ::kiln::fail("cuda", "{} failed: cublas status {} ({}:{})", #call, \
                                                  static_cast<int>(s_), __FILE__, __LINE__);           \
  } while (0)

// The per-step arena: one device buffer handed out as a stack. A Tensor's holder marks its record
// dead when the last copy goes; dead records are popped from the top, so the LIFO lifetimes of a
// forward pass (layer temporaries) reuse memory, and every step with the same shapes gets the same
// addresses (which is what lets a captured graph be replayed).
struct ArenaState {
  std::shared_ptr<void> base;  // device memory
  size_t capacity = 0;
  struct Rec {
    size_t offset, bytes;
    bool live;
  };
  std::vector<Rec> stack;
  size_t top = 0, need = 0;  // need: the high-water mark of top, records past capacity included
  uint64_t alloc_hash = 0;   // hash of (offset, bytes) since the last reset_hash
};

struct PinnedBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~PinnedBuf() {
    if (ptr) cudaFreeHost(ptr);
  }
};

struct GemmKey {
  int64_t m, n, k;
  int ytype, bias, align;
  bool operator<(const GemmKey& o) const {
    return std::tie(m, n, k, ytype, bias, align) < std::tie(o.m, o.n, o.k, o.ytype, o.bias, o.align);
  }
};
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// CudaBackends alive in the process. The persistent kernel (launch_q4_decoder) is launched only
// while there is one: it spins at grid barriers that need all of its blocks
// resident, so two of them on two backends' streams at once could each hold SMs the other waits for.
int live_cuda_backends();

struct CudaBackend::Impl {
  CudaOptions opt;  // the environment's switches at construction (options.h)
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 32u << 20;
  // Arrival counters of the decode attention's split merge (launch_attention_decode), zero between launches.
  unsigned* attn_counters = nullptr;
  int64_t attn_counters_n = 16384;
  // The grid barrier's arrival counters of the decoder stack (launch_q4_decoder): kGridBarrierWords
  // zeroed words.
  unsigned long long* grid_barrier = nullptr;
  CudaStats stats;
  AttnKernel attn_kernel = AttnKernel::automatic;
  int n_sms = 132;

  // ---- per-step state
  bool in_step = false;
  std::shared_ptr<ArenaState> arena;
  bool arena_overflowed = false;
  std::shared_ptr<PinnedBuf> staging;  // pinned host memory for uploads inside a step
  size_t staging_top = 0;
  std::vector<std::shared_ptr<PinnedBuf>> download_pool;  // pinned buffers handed out by to_host
  // t's bytes into a pinned buffer of download_pool; wait = synchronize before returning.
  Tensor download(const Tensor& t, bool wait);

  // ---- graphs
  enum class Mode { eager, capture, replay } mode = Mode::eager;
  bool graphs_enabled = true;
  uint64_t graph_key = 0;
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t alloc_hash = 0, ptr_hash = 0;
  };
  uint64_t ptr_hash = 0;  // device pointers given to ops inside the graph region (checked on replay)
  void note(const void* p) { ptr_hash = ptr_hash * 1000003u + reinterpret_cast<uintptr_t>(p); }
  std::map<uint64_t, Graph> graphs;
  std::set<uint64_t> seen;

  // ---- weights: host address range -> device copy
  struct Resident {
    size_t bytes;
    std::shared_ptr<void> host_holder, dev;
    // Disjoint byte ranges [offset, end) of this tensor re-laid out through views (4-bit MoE experts
    // of a stacked tensor, row slices of a fused projection): once they cover it, nothing reads it.
    std::map<size_t, size_t> tiled = {};
    size_t tiled_bytes = 0;
  };
  std::map<uintptr_t, Resident> resident;
  // 4-bit weights in the tiled layout (qkernels.h), by the address of their code tensor (host or
  // device); `source` keeps that tensor's memory alive, so the address names one weight for good.
  struct Q4Tiled {
    int64_t out, in;
    int group_size;
    Tensor codes, pairs;
    std::shared_ptr<void> source;
  };
  std::map<uintptr_t, Q4Tiled> q4_tiled;
  // The group size of the tiled 4-bit weights (0: none yet, -1: several): the one producer kernels
  // write qx for (skip_producing).
  int q4_group = 0;

  // ---- the activation cache (act_cache.cpp): the 4-bit GEMV's quantized copy (qx) of an activation,
  // written by the kernel of the op that produced the activation, so that the GEMV reading it next
  // skips its own quantize kernel. An entry lives from its producer's gate to the next gate that may
  // write its bytes (skip*), an allocation over them (forget_qx from dev_alloc / arena_alloc) or the
  // step's end; it holds the qx buffer (arena memory) for that long.
  struct QxEntry {
    const void* data;  // the activation: bf16 [n, in] at this address
    int64_t n, in;
    int group_size;
    Tensor qx;  // q4_qx_bytes(n, in, group_size) bytes
  };
  std::vector<QxEntry> qx_cache;
  void forget_qx(const void* p, size_t bytes);  // ends the entries whose activation overlaps these bytes

  std::map<GemmKey, GemmPlan> gemm_plans;

  // ---- L2 prefetch of the next GEMV's weights (L2Prefetch): the byte ranges of each 4-bit GEMV's
  // weights in this step, in order, and in the previous step (a decode step repeats the last one's
  // sequence; a wrong guess only costs bandwidth). The ops before a GEMV that leave DRAM idle
  // (add_rms_norm, gated_act) prefetch up to l2_prefetch_bytes of it: 4 MB measured best on the H200
  // (llama-3-8b 4-bit, medians of 9 alternating pairs in two calls: batch 8 +4.6%, batch 1 +2.4%, within
  // its spread; 8 MB and more slowed batch 1). CudaOptions::l2_prefetch_mb sets it (0: off).
  using Ranges = std::vector<std::pair<const void*, int64_t>>;
  std::vector<Ranges> gemv_seq, gemv_prev;
  int64_t l2_prefetch_bytes = int64_t{4} << 20;
  // The first l2_prefetch_bytes of the GEMV that came next at this point of the previous step.
  L2Prefetch next_gemv_prefetch() const;

  // ---- profiling (KILN_CUDA_PROFILE=1)
  bool profile = false;
  struct ProfEntry {
    double ms = 0;
    int64_t calls = 0;
  };
  std::map<std::string, ProfEntry> prof;
  std::vector<std::pair<std::string, std::pair<cudaEvent_t, cudaEvent_t>>> prof_pending;

  // The launch gate: every op calls one of these once its host work is done (checks, residency, the
  // allocations a replay must repeat) and returns when it is true (graph replay: the captured graph
  // does the work), so it runs alike in eager, capture and replay mode. It is also the activation
  // cache's write fence (act_cache.cpp): from here the op may write device memory, so the cached qx
  // copies end: all of them (skip()), or, for an op that names every buffer it writes (a matmul, a
  // copy), those of the activations that overlap them. A producer op of qx (rms_norm, add_rms_norm,
  // gated_act, the decode attention) calls skip_producing instead: the fence, then `out`'s qx for
  // its kernel to write beside it when `want` and out fits the 4-bit GEMV (bf16, decode-sized,
  // inside a step, 4-bit weights loaded), else an empty QxOut.
  bool skip();
  bool skip(const Tensor& written);
  bool skip(std::span<Tensor* const> written);
  bool skip_producing(Tensor& out, QxOut& qx, bool want = true);
  // The activation cache's qx of x (bf16 [n, in] at x.data, written since the last fence that could
  // touch x by the op that produced x), else null.
  const Tensor* cached_qx(const Tensor& x, int64_t n, int64_t in, int group_size) const;
  void drop_graphs();
  Tensor dev_alloc(DType t, Shape s);              // persistent cudaMalloc
  Tensor arena_alloc(DType t, Shape s);            // per-step
  // Device scratch of an op: from the arena inside a step, else one persistent buffer (grown as
  // needed; ops outside steps run in stream order, so one buffer serves them all).
  Tensor scratch(int64_t bytes);
  Tensor loose_scratch;
  Tensor resident_of(const Tensor& t, const char* op);  // device view of a weight
  void flush_profile();
};

// Times one op with events when profiling (graphs are off then).
class ProfScope {
 public:
  ProfScope(CudaBackend::Impl& im, const char* name);
  ~ProfScope();

 private:
  CudaBackend::Impl& im_;
  const char* name_;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

Dt dt_of(const Tensor& t, const char* op, const char* arg);
// The CUDA side of an op's argument checks (checks.h has the shared ones), "[cuda] <op>: <arg> ...":
// device memory (or empty), and int32 / an activation dtype (bf16 or f32) on top (cuda_ops.cpp).
void require_device(const Tensor& t, const char* op, const char* arg);
void require_i32(const Tensor& t, const char* op, const char* arg);
void require_act(const Tensor& t, const char* op, const char* arg);

}  // namespace kiln::backend::cuda
