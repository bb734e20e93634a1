// CudaBackend buffers and step machinery: persistent allocations (weights, KV cache), the
// per-step arena, pinned staging for uploads and downloads, CUDA-graph capture/replay of decode
// steps, the weight residency map (host address -> device copy) and op profiling.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kiln/backend/checks.h"
#include "kiln/backend/cuda/core/cuda_impl.h"
#include "kiln/backend/cuda/core/probe_hooks.h"
#include "kiln/backend/cuda/quant/qkernels.h"

namespace kiln::backend::cuda {

namespace {

constexpr size_t kAlign = 256;
constexpr size_t kInitialArena = 64u << 20;
constexpr size_t kInitialStaging = 16u << 20;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

std::shared_ptr<void> device_malloc(size_t bytes, CudaStats& st) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, kAlign)));
  ++st.device_mallocs;
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

std::shared_ptr<PinnedBuf> pinned(size_t bytes) {
  auto b = std::make_shared<PinnedBuf>();
  CUDA_CHECK(cudaHostAlloc(&b->ptr, std::max<size_t>(bytes, 4096), cudaHostAllocDefault));
  b->bytes = std::max<size_t>(bytes, 4096);
  return b;
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

}  // namespace

Dt dt_of(const Tensor& t, const char* op, const char* arg) {
  switch (t.dtype) {
    case DType::f32: return Dt::f32;
    case DType::bf16: return Dt::bf16;
    case DType::f16: return Dt::f16;
    default: fail("cuda", "{}: {} must be a float tensor, got {}", op, arg, dtype_name(t.dtype));
  }
}

namespace {
std::atomic<int> g_live_backends{0};
}  // namespace

int live_cuda_backends() { return g_live_backends.load(); }

CudaBackend::CudaBackend(int device) : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  im.device = device;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) fail("cuda", "no CUDA device found; use --device cpu");
  if (device < 0 || device >= n) fail("cuda", "device {} requested but {} present", device, n);
  CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  im.n_sms = prop.multiProcessorCount;
  CUDA_CHECK(cudaStreamCreateWithFlags(&im.stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasLtCreate(&im.lt));
  CUDA_CHECK(cudaMalloc(&im.workspace, im.workspace_bytes));
  ++im.stats.device_mallocs;
  CUDA_CHECK(cudaMalloc(&im.attn_counters, im.attn_counters_n * sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(im.attn_counters, 0, im.attn_counters_n * sizeof(unsigned)));
  ++im.stats.device_mallocs;
  CUDA_CHECK(cudaMalloc(&im.grid_barrier, kGridBarrierWords * sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(im.grid_barrier, 0, kGridBarrierWords * sizeof(unsigned long long)));
  ++im.stats.device_mallocs;
  im.arena = std::make_shared<ArenaState>();
  im.arena->base = device_malloc(kInitialArena, im.stats);
  im.arena->capacity = kInitialArena;
  im.stats.arena_bytes = kInitialArena;
  im.staging = pinned(kInitialStaging);
  im.opt = CudaOptions::from_env();
  im.profile = im.opt.profile;
  im.graphs_enabled = im.opt.graphs && !im.profile;
  im.l2_prefetch_bytes = im.opt.l2_prefetch_mb << 20;
  KILN_STAMPS_START();  // a probe build's stamps (probe_hooks.h; nothing otherwise)
  ++g_live_backends;  // last: a constructor that throws leaves no backend
}

L2Prefetch CudaBackend::Impl::next_gemv_prefetch() const {
  L2Prefetch pf;
  if (!in_step || l2_prefetch_bytes <= 0 || gemv_seq.size() >= gemv_prev.size()) return pf;
  const Ranges& r = gemv_prev[gemv_seq.size()];
  int64_t total = 0;
  for (const auto& [p, b] : r) total += b;
  // Every range's same leading fraction (the GEMV's first blocks read the first tiles of each).
  const double f = std::min(1.0, static_cast<double>(l2_prefetch_bytes) / static_cast<double>(std::max<int64_t>(1, total)));
  for (const auto& [p, b] : r) {
    if (pf.n == L2Prefetch::kMax) break;
    pf.p[pf.n] = static_cast<const char*>(p);
    pf.bytes[pf.n++] = static_cast<int64_t>(static_cast<double>(b) * f);
  }
  pf.blocks = std::min<int>(n_sms, static_cast<int>(std::min(total, l2_prefetch_bytes) >> 18) + 1);  // ~256 KB each
  return pf;
}

CudaBackend::~CudaBackend() {
  --g_live_backends;
  Impl& im = *impl_;
  cudaStreamSynchronize(im.stream);
  im.drop_graphs();
  for (auto& [k, p] : im.gemm_plans) {
    cublasLtMatmulDescDestroy(p.op);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
  }
  for (auto& [n, ev] : im.prof_pending) cudaEventDestroy(ev.first), cudaEventDestroy(ev.second);
  if (im.lt) cublasLtDestroy(im.lt);
  if (im.workspace) cudaFree(im.workspace);
  if (im.attn_counters) cudaFree(im.attn_counters);
  if (im.grid_barrier) cudaFree(im.grid_barrier);
  if (im.stream) cudaStreamDestroy(im.stream);
}

const CudaStats& CudaBackend::stats() const { return impl_->stats; }
void CudaBackend::set_attention_kernel(AttnKernel k) { impl_->attn_kernel = k; }
void CudaBackend::set_fused_decoder(bool on) { impl_->opt.fused_decoder = on; }

void CudaBackend::set_graphs_enabled(bool on) {
  impl_->graphs_enabled = on && !impl_->profile;
  if (!on) impl_->drop_graphs();
}

void CudaBackend::Impl::drop_graphs() {
  for (auto& [k, g] : graphs) cudaGraphExecDestroy(g.exec);
  graphs.clear();
  seen.clear();
}

// ---- buffers

Tensor CudaBackend::Impl::dev_alloc(DType t, Shape s) {
  Tensor r{.dtype = t, .shape = std::move(s), .device = Device::cuda};
  r.holder = device_malloc(r.nbytes(), stats);
  r.data = r.holder.get();
  forget_qx(r.data, r.nbytes());  // a new tensor at a reused address
  return r;
}

Tensor CudaBackend::Impl::arena_alloc(DType t, Shape s) {
  Tensor r{.dtype = t, .shape = std::move(s), .device = Device::cuda};
  ArenaState& a = *arena;
  const size_t bytes = round_up(std::max<size_t>(r.nbytes(), 1), kAlign);
  // A record that does not fit gets a plain allocation, but it still goes on the stack, so the stack
  // keeps the offsets a large enough arena would give. `need` is then that arena's size, and the next
  // begin_step grows to it in one go. Counting only the records that fit took up to three steps, and
  // each overflowing step was slow: 29k against 35.8k tok/s warm for a 2048-token prefill of the 4-bit
  // llama-3-8b on the H200.
  const size_t idx = a.stack.size(), off = a.top;
  a.stack.push_back({off, bytes, true});
  a.top += bytes;
  a.need = std::max(a.need, a.top);
  a.alloc_hash = mix(mix(a.alloc_hash, off), bytes);
  std::shared_ptr<void> overflow;  // the plain allocation of a record past the arena's end
  if (a.top > a.capacity) {
    arena_overflowed = true;
    ++stats.arena_overflows;
    overflow = device_malloc(bytes, stats);
    r.data = overflow.get();
  } else {
    r.data = static_cast<char*>(a.base.get()) + off;
  }
  forget_qx(r.data, bytes);  // a new tensor at a reused address
  std::shared_ptr<ArenaState> keep = arena;
  r.holder = std::shared_ptr<void>(r.data, [keep, idx, overflow](void*) {
    ArenaState& s = *keep;
    if (idx < s.stack.size()) s.stack[idx].live = false;
    while (!s.stack.empty() && !s.stack.back().live) {
      s.top = s.stack.back().offset;
      s.stack.pop_back();
    }
  });
  return r;
}

Tensor CudaBackend::alloc(DType t, Shape s) {
  return impl_->in_step ? impl_->arena_alloc(t, std::move(s)) : impl_->dev_alloc(t, std::move(s));
}

Tensor CudaBackend::Impl::scratch(int64_t bytes) {
  if (in_step) return arena_alloc(DType::u8, {bytes});
  if (loose_scratch.numel() < bytes) loose_scratch = dev_alloc(DType::u8, {bytes});
  return loose_scratch;
}

Tensor CudaBackend::upload(const Tensor& host) {
  Impl& im = *impl_;
  if (host.device == Device::cuda) return host;
  Tensor d = alloc(host.dtype, host.shape);
  const size_t n = host.nbytes();
  if (n == 0) return d;
  if (im.in_step) {
    // Through pinned staging, so the copy is asynchronous and needs no synchronization here.
    if (im.staging_top + n > im.staging->bytes) {
      CUDA_CHECK(cudaStreamSynchronize(im.stream));  // the old buffer (or its start) may still be read
      if (im.staging_top == 0 || n > im.staging->bytes / 2)
        im.staging = pinned(std::max(2 * im.staging->bytes, 2 * n));
      im.staging_top = 0;
    }
    char* dst = static_cast<char*>(im.staging->ptr) + im.staging_top;
    std::memcpy(dst, host.data, n);
    im.staging_top = round_up(im.staging_top + n, 64);
    CUDA_CHECK(cudaMemcpyAsync(d.data, dst, n, cudaMemcpyHostToDevice, im.stream));
  } else {
    CUDA_CHECK(cudaMemcpyAsync(d.data, host.data, n, cudaMemcpyHostToDevice, im.stream));
    CUDA_CHECK(cudaStreamSynchronize(im.stream));
  }
  return d;
}

Tensor CudaBackend::Impl::download(const Tensor& t, bool wait) {
  const size_t n = t.nbytes();
  // A pinned buffer nobody else holds (use_count 1), else a new one: results handed out earlier
  // stay valid as long as the caller keeps them.
  std::shared_ptr<PinnedBuf> buf;
  for (auto& b : download_pool)
    if (b.use_count() == 1 && b->bytes >= n) {
      buf = b;
      break;
    }
  if (!buf) {
    buf = pinned(n);
    download_pool.push_back(buf);
  }
  if (n) CUDA_CHECK(cudaMemcpyAsync(buf->ptr, t.data, n, cudaMemcpyDeviceToHost, stream));
  if (wait) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (profile) flush_profile();
  }
  Tensor h = t;
  h.device = Device::cpu;
  h.data = buf->ptr;
  h.holder = std::shared_ptr<void>(buf, buf->ptr);
  return h;
}

Tensor CudaBackend::to_host(const Tensor& t) {
  return t.device == Device::cuda ? impl_->download(t, /*wait=*/true) : t;
}

Tensor CudaBackend::to_host_async(const Tensor& t) {
  if (t.device == Device::cuda) return impl_->download(t, /*wait=*/false);
  Tensor h = Tensor::host(t.dtype, t.shape);
  std::memcpy(h.data, t.data, t.nbytes());
  return h;
}

std::function<void()> CudaBackend::fence() {
  cudaEvent_t ev = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ev, impl_->stream));
  std::shared_ptr<CUevent_st> keep(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
  return [keep, device = impl_->device] {
    CUDA_CHECK(cudaSetDevice(device));  // (the waiting thread may not have made it current)
    CUDA_CHECK(cudaEventSynchronize(keep.get()));
  };
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  Impl& im = *impl_;
  checks::copy("cuda", src, dst);
  if (im.skip(dst) || src.data == dst.data || src.nbytes() == 0) return;
  ProfScope ps(im, "copy");
  auto kind = src.device == Device::cuda ? (dst.device == Device::cuda ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                         : (dst.device == Device::cuda ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), kind, im.stream));
  if (kind != cudaMemcpyDeviceToDevice) CUDA_CHECK(cudaStreamSynchronize(im.stream));
}

void CudaBackend::fill_zero(Tensor& t) {
  Impl& im = *impl_;
  if (im.skip() || t.nbytes() == 0) return;
  if (t.device != Device::cuda) fail("cuda", "fill_zero: tensor is not on the device");
  CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), im.stream));
}

void CudaBackend::synchronize() { CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

// ---- steps and graphs

void CudaBackend::begin_step() {
  Impl& im = *impl_;
  if (im.in_step) fail("cuda", "begin_step: a step is already open");
  // Uploads reuse the staging buffer from its start: everything queued before must be done.
  CUDA_CHECK(cudaStreamSynchronize(im.stream));
  im.staging_top = 0;
  im.qx_cache.clear();
  if (!im.gemv_seq.empty()) im.gemv_prev = std::move(im.gemv_seq);
  im.gemv_seq.clear();
  ArenaState& a = *im.arena;
  if (im.arena_overflowed && a.stack.empty()) {
    // Grow to what the largest step needed (+25%); captured graphs point into the old buffer.
    const size_t cap = round_up(a.need + a.need / 4, 1 << 20);
    im.drop_graphs();
    auto next = std::make_shared<ArenaState>();
    im.arena.reset();  // frees the old buffer before taking the new one
    next->base = device_malloc(cap, im.stats);
    next->capacity = cap;
    im.arena = next;
    im.stats.arena_bytes = static_cast<int64_t>(cap);
    im.arena_overflowed = false;
  }
  im.in_step = true;
}

void CudaBackend::end_step() {
  Impl& im = *impl_;
  if (im.mode == Impl::Mode::capture) {  // an exception escaped the captured region: drop the capture
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(im.stream, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
  }
  im.mode = Impl::Mode::eager;
  im.in_step = false;
  im.qx_cache.clear();  // its qx buffers are the step's arena memory
}

bool CudaBackend::begin_graph(uint64_t key) {
  Impl& im = *impl_;
  if (!im.graphs_enabled || !im.in_step || im.mode != Impl::Mode::eager) return false;
  // The arena's top folds in whatever was allocated before (the step's uploads), so a replay
  // always finds its inputs at the captured addresses.
  ArenaState& a = *im.arena;
  key = mix(mix(key, a.top), reinterpret_cast<uintptr_t>(a.base.get()));
  im.graph_key = key;
  a.alloc_hash = 0;
  im.ptr_hash = 0;
  if (im.graphs.count(key)) {
    im.mode = Impl::Mode::replay;
  } else if (im.seen.count(key) && !im.arena_overflowed) {
    CUDA_CHECK(cudaStreamBeginCapture(im.stream, cudaStreamCaptureModeThreadLocal));
    im.mode = Impl::Mode::capture;
  } else {
    im.seen.insert(key);  // the first run is eager: it sizes the arena
    im.mode = Impl::Mode::eager;
  }
  return true;
}

void CudaBackend::end_graph() {
  Impl& im = *impl_;
  const uint64_t hash = im.arena->alloc_hash;
  if (im.mode == Impl::Mode::capture) {
    cudaGraph_t g = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(im.stream, &g));
    Impl::Graph gr;
    CUDA_CHECK(cudaGraphInstantiate(&gr.exec, g, 0));
    cudaGraphDestroy(g);
    gr.alloc_hash = hash;
    gr.ptr_hash = im.ptr_hash;
    im.graphs[im.graph_key] = gr;
    ++im.stats.graph_captures;
    CUDA_CHECK(cudaGraphLaunch(gr.exec, im.stream));
  } else if (im.mode == Impl::Mode::replay) {
    const Impl::Graph& gr = im.graphs.at(im.graph_key);
    // The ops' host calls must have allocated exactly as when captured, else the graph's
    // addresses are stale: a programming error in the caller's key.
    KILN_ASSERT(gr.alloc_hash == hash, "graph replay: the step allocated differently from its capture");
    KILN_ASSERT(gr.ptr_hash == im.ptr_hash, "graph replay: ops got other buffers (a KV cache?) than when captured");
    CUDA_CHECK(cudaGraphLaunch(gr.exec, im.stream));
    ++im.stats.graph_replays;
  }
  im.mode = Impl::Mode::eager;
}

// ---- weights

Tensor CudaBackend::Impl::resident_of(const Tensor& t, const char* op) {
  if (t.empty() || t.device == Device::cuda) return t;
  const auto p = reinterpret_cast<uintptr_t>(t.data);
  auto it = resident.upper_bound(p);
  if (it != resident.begin()) {
    --it;
    if (p + t.nbytes() <= it->first + it->second.bytes) {  // a view inside an uploaded tensor (phi3 slices)
      Tensor d = t;
      d.device = Device::cuda;
      d.data = static_cast<char*>(it->second.dev.get()) + (p - it->first);
      d.holder = it->second.dev;
      return d;
    }
  }
  // First use of this weight: copy it once. Outside a step only (weights must not live in the arena).
  Tensor d = dev_alloc(t.dtype, t.shape);
  CUDA_CHECK(cudaMemcpyAsync(d.data, t.data, t.nbytes(), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  stats.weight_bytes += static_cast<int64_t>(t.nbytes());
  resident[p] = Resident{t.nbytes(), t.holder, d.holder};
  return d;
}

void CudaBackend::prefetch_weight(const Tensor& host) { impl_->resident_of(host, "prefetch"); }

// ---- profiling

ProfScope::ProfScope(CudaBackend::Impl& im, const char* name) : im_(im), name_(name) {
  if (!im_.profile) return;
  cudaEventCreate(&a_);
  cudaEventCreate(&b_);
  cudaEventRecord(a_, im_.stream);
}

ProfScope::~ProfScope() {
  if (!im_.profile) return;
  cudaEventRecord(b_, im_.stream);
  im_.prof_pending.push_back({name_, {a_, b_}});
}

void CudaBackend::Impl::flush_profile() {
  for (auto& [n, ev] : prof_pending) {
    float ms = 0;
    cudaEventElapsedTime(&ms, ev.first, ev.second);
    prof[n].ms += ms;
    ++prof[n].calls;
    cudaEventDestroy(ev.first);
    cudaEventDestroy(ev.second);
  }
  prof_pending.clear();
}

std::string CudaBackend::profile_report() const {
  double total = 0;
  for (auto& [n, e] : impl_->prof) total += e.ms;
  std::string r = fmt::format("{:<28} {:>10} {:>10} {:>7}\n", "op", "calls", "ms", "share");
  for (auto& [n, e] : impl_->prof)
    r += fmt::format("{:<28} {:>10} {:>10.3f} {:>6.1f}%\n", n, e.calls, e.ms, total > 0 ? 100 * e.ms / total : 0.0);
  return r;
}

}  // namespace kiln::backend::cuda

namespace kiln::backend {

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<cuda::CudaBackend>(device); }

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  return n > 0;
}

}  // namespace kiln::backend
