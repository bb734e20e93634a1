// CudaBackend's MoE ops (host side): argument checks, the per-layer cache of expert pointer tables
// and the choice between the device kernels (moe.cu) and Backend's host defaults. The choice
// depends only on the experts' weights (shapes, dtypes) and the token count, all known on the
// host, so a captured graph replays the same choice; in replay mode an op checks, allocates its
// scratch exactly as when captured, and returns.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "kiln/backend/cuda/core/cuda_impl.h"

namespace kiln::backend::cuda {

// One MoE layer's experts, found again by the host addresses of their weights (weights are never
// freed while the backend holds them resident, so an address names one layer for good).
struct CudaBackend::MoeCache {
  struct Key {
    uintptr_t gate0, up0, down0, down_last;
    size_t n_experts;
    bool operator<(const Key& o) const {
      return std::tie(gate0, up0, down0, down_last, n_experts) <
             std::tie(o.gate0, o.up0, o.down0, o.down_last, o.n_experts);
    }
  };
  struct Entry {
    bool dense = false;  // every expert a dense float gated MLP of one dtype and shape, no bias
    int64_t dim = 0, ffn = 0;
    DType wt = DType::f32;
    Tensor table;               // device u32 [3 * E * 2]: E gate, E up, E down pointers (empty until first use)
    bool aligned16 = false;     // every expert matrix starts on a 16-byte boundary
    std::vector<Tensor> keep;   // the device weights the table points into
    std::vector<std::shared_ptr<void>> host_keep;  // the keyed host weights: their addresses stay unique
  };
  std::map<Key, Entry> entries;
};

namespace {

// Experts outside this count keep the host default (grid.y = n * k stays under 65536 for 16 tokens).
constexpr int64_t kMoeMaxExperts = 2048;

CudaBackend::MoeCache::Key key_of(std::span<const ExpertWeights> ex) {
  auto addr = [](const Weight* w) { return w ? reinterpret_cast<uintptr_t>(w->w.data) : uintptr_t{0}; };
  return {addr(ex[0].gate), addr(ex[0].up), addr(ex[0].down), addr(ex.back().down), ex.size()};
}

// Whether the experts fit the device kernels: dense f32/bf16/f16 matrices of one dtype,
// gate/up [ffn, dim] and down [dim, ffn] for every expert, no biases.
CudaBackend::MoeCache::Entry inspect(std::span<const ExpertWeights> ex) {
  CudaBackend::MoeCache::Entry r;
  const ExpertWeights& e0 = ex[0];
  if (!e0.gate || !e0.up || !e0.down || !ex.back().down || e0.gate->w.ndim() != 2) return r;
  r.host_keep = {e0.gate->w.holder, e0.up->w.holder, e0.down->w.holder, ex.back().down->w.holder};
  r.ffn = e0.gate->w.dim(0);
  r.dim = e0.gate->w.dim(1);
  r.wt = e0.gate->w.dtype;
  if (r.wt != DType::f32 && r.wt != DType::bf16 && r.wt != DType::f16) return r;
  auto fits = [&](const Weight* w, int64_t rows, int64_t cols) {
    return w && !w->quantized() && w->bias.empty() && !w->w.empty() && w->w.ndim() == 2 && w->w.dtype == r.wt &&
           w->w.dim(0) == rows && w->w.dim(1) == cols;
  };
  for (const ExpertWeights& e : ex)
    if (!fits(e.gate, r.ffn, r.dim) || !fits(e.up, r.ffn, r.dim) || !fits(e.down, r.dim, r.ffn)) return r;
  r.dense = true;
  return r;
}

void require_dev(const Tensor& t, DType want, const char* op, const char* arg) {
  if (t.numel() != 0 && (t.empty() || t.device != Device::cuda))
    fail("cuda", "{}: {} is not a device tensor; upload it first", op, arg);
  if (t.dtype != want) fail("cuda", "{}: {} must be {}, got {}", op, arg, dtype_name(want), dtype_name(t.dtype));
}

}  // namespace

void CudaBackend::moe_route(const Tensor& logits, int top_k, bool norm_topk_prob, Tensor& ids, Tensor& weights) {
  Impl& im = *impl_;
  const int64_t n = logits.rows(), n_experts = logits.cols();
  if (!impl_->opt.moe || n_experts > kMoeRouteMaxExperts)
    return Backend::moe_route(logits, top_k, norm_topk_prob, ids, weights);
  const char* op = "moe_route";
  if (logits.numel() != 0 && (logits.empty() || logits.device != Device::cuda))
    fail("cuda", "moe_route: logits are not a device tensor; upload them first");
  const Dt lt = dt_of(logits, op, "logits");
  if (top_k < 1 || top_k > n_experts)
    fail("cuda", "moe_route: top_k {} for {} experts (router logits {})", top_k, n_experts, shape_str(logits.shape));
  require_dev(ids, DType::i32, op, "ids");
  require_dev(weights, DType::f32, op, "weights");
  if (ids.numel() != n * top_k || weights.numel() != n * top_k)
    fail("cuda", "moe_route: ids {} and weights {} for [{}, {}]", shape_str(ids.shape), shape_str(weights.shape), n,
         top_k);
  if (im.skip()) return;
  ProfScope ps(im, "moe_route");
  launch_moe_route(logits.data, lt, n, n_experts, top_k, norm_topk_prob, ids.ptr<int32_t>(), weights.ptr<float>(),
                   im.stream);
}

bool CudaBackend::moe_on_device(std::span<const ExpertWeights> experts, int64_t n_tokens) const {
  if (!impl_->opt.moe || experts.empty() || n_tokens > kMoeMaxTokens ||
      static_cast<int64_t>(experts.size()) > kMoeMaxExperts)
    return false;
  if (!moe_) moe_ = std::make_shared<MoeCache>();
  auto [it, fresh] = moe_->entries.try_emplace(key_of(experts));
  if (fresh) it->second = inspect(experts);
  return it->second.dense;
}

void CudaBackend::moe_experts(const Tensor& x, std::span<const ExpertWeights> experts, Activation act,
                              const Tensor& ids, const Tensor& weights, Tensor& out) {
  Impl& im = *impl_;
  const int64_t n = x.rows(), dim = x.cols(), n_experts = static_cast<int64_t>(experts.size());
  const bool act_ok = (x.dtype == DType::bf16 || x.dtype == DType::f32) &&
                      (out.dtype == DType::bf16 || out.dtype == DType::f32);
  if (n == 0 || !act_ok || !moe_on_device(experts, n)) return Backend::moe_experts(x, experts, act, ids, weights, out);
  const char* op = "moe_experts";
  require_dev(x, x.dtype, op, "x");
  require_dev(out, out.dtype, op, "out");
  require_dev(ids, DType::i32, op, "ids");
  require_dev(weights, DType::f32, op, "weights");
  const int64_t k = ids.numel() / n;
  if (k < 1 || ids.numel() != n * k || weights.numel() != n * k)
    fail("cuda", "moe_experts: ids {} and weights {} must be [{}, top_k]", shape_str(ids.shape),
         shape_str(weights.shape), n);
  MoeCache::Entry& en = moe_->entries.at(key_of(experts));
  if (dim != en.dim || out.numel() != n * dim)
    fail("cuda", "moe_experts: x {} and out {} for experts of gate/up [{}, {}]", shape_str(x.shape),
         shape_str(out.shape), en.ffn, en.dim);
  if (x.data == out.data) fail("cuda", "moe_experts: out must not alias x");
  if (en.table.empty()) {
    // First use: make every expert resident and upload the pointer table, once per layer. This
    // happens in the first (eager) run of any step shape, never inside a capture: the copy syncs.
    if (im.mode == Impl::Mode::capture) fail("cuda", "moe_experts: first use of a layer's experts inside a graph capture");
    std::vector<uint64_t> ptrs(3 * n_experts);
    en.aligned16 = true;
    for (int64_t e = 0; e < n_experts; ++e) {
      const Weight* w3[3] = {experts[e].gate, experts[e].up, experts[e].down};
      for (int m = 0; m < 3; ++m) {
        en.keep.push_back(im.resident_of(w3[m]->w, op));
        const auto p = reinterpret_cast<uintptr_t>(en.keep.back().data);
        en.aligned16 &= p % 16 == 0;
        ptrs[m * n_experts + e] = p;
      }
    }
    en.table = im.dev_alloc(DType::u32, {6 * n_experts});  // 3 * E 64-bit pointers
    CUDA_CHECK(cudaMemcpyAsync(en.table.data, ptrs.data(), ptrs.size() * sizeof(uint64_t), cudaMemcpyHostToDevice,
                               im.stream));
    CUDA_CHECK(cudaStreamSynchronize(im.stream));
  }
  // bf16 scratch, as the default's bf16 gate/up/ye tensors: h [n * k, ffn], y [n * k, dim].
  Tensor h = alloc(DType::bf16, {n * k, std::max<int64_t>(en.ffn, 1)});
  Tensor y = alloc(DType::bf16, {n * k, dim});
  if (im.skip()) return;
  ProfScope ps(im, "moe_experts");
  const auto table = static_cast<const void* const*>(en.table.data);
  // 16-byte weight loads of VEC elements need every row of every matrix (and of x, h) on a VEC
  // boundary: aligned bases and dim, ffn multiples of VEC. x's loads are VEC elements of its dtype.
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(en.wt));
  const int64_t x_align = std::min<int64_t>(16, vec * static_cast<int64_t>(dtype_size(x.dtype)));
  const bool vector =
      en.aligned16 && dim % vec == 0 && en.ffn % vec == 0 && reinterpret_cast<uintptr_t>(x.data) % x_align == 0;
  const MoeExpertsArgs a{.x = x.data, .xt = dt_of(x, op, "x"), .gate = table, .up = table + n_experts,
                         .down = table + 2 * n_experts, .wt = dt_of(en.keep[0], op, "expert weights"),
                         .ids = ids.ptr<int32_t>(), .weights = weights.ptr<float>(), .n = n, .k = k,
                         .n_experts = n_experts, .dim = dim, .ffn = en.ffn, .act = static_cast<int>(act),
                         .vector = vector, .h = h.data, .y = y.data, .out = out.data, .ot = dt_of(out, op, "out")};
  launch_moe_experts(a, im.stream);
}

}  // namespace kiln::backend::cuda
