// CudaBackend's fused ops (host side): argument checks as the separate ops make them ("[cuda]
// <op>: ..."), weight residency, and one launch each (fused.cu, gemv_fast.cu). The choice between
// the fused launch and Backend's default loop depends only on shapes, dtypes and addresses known
// on the host, so a captured graph replays the same choice; in replay mode an op checks and returns.
// KILN_CUDA_FUSED=0 (CudaOptions::fused) runs Backend's defaults (the separate ops) instead.
#include <algorithm>
#include <vector>

#include "kiln/backend/checks.h"
#include "kiln/backend/cuda/core/cuda_impl.h"
#include "kiln/backend/cuda/quant/cuda_qops.h"

namespace kiln::backend::cuda {

namespace {

static_assert(Backend::kMaxMultiMatmul == GemvFastMulti::kMax, "one launch must hold every pair");

}  // namespace

void CudaBackend::add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, bool one_plus_w,
                               Tensor& y) {
  if (!impl_->opt.fused) return Backend::add_rms_norm(x, delta, w, eps, one_plus_w, y);
  Impl& im = *impl_;
  checks::each(require_act, "add_rms_norm", {{x, "x"}, {delta, "delta"}, {y, "y"}});
  const int64_t dim = x.cols(), rows = x.rows();
  if (delta.numel() != x.numel() || y.numel() != x.numel() || delta.dtype != x.dtype || y.dtype != x.dtype)
    fail("cuda", "add_rms_norm: x {} {}, delta {} {} and y {} {} must match", dtype_name(x.dtype), shape_str(x.shape),
         dtype_name(delta.dtype), shape_str(delta.shape), dtype_name(y.dtype), shape_str(y.shape));
  if (w.numel() != dim) fail("cuda", "add_rms_norm: weight {} for rows of {}", shape_str(w.shape), dim);
  const Dt wt = dt_of(w, "add_rms_norm", "w");
  Tensor W = im.resident_of(w, "add_rms_norm");
  QxOut qx;  // y's quantized form for a 4-bit GEMV, written by the same kernel (x is written too)
  if (im.skip_producing(y, qx)) return;
  ProfScope ps(im, "add_rms_norm");
  launch_add_rms_norm(x.data, delta.data, dt_of(x, "add_rms_norm", "x"), W.data, wt, eps, one_plus_w, rows, dim,
                      y.data, im.stream, qx, qx.base ? im.next_gemv_prefetch() : L2Prefetch());
}

bool CudaBackend::decoder_stack(const DecoderStackArgs& a, Tensor& x) {
  return impl_->opt.fused && quantized_decoder_stack(*this, *impl_, a, x);
}

namespace {
// The FusedDecoder hook of a CudaBackend (its decoder_stack).
class CudaFusedDecoder final : public FusedDecoder {
 public:
  explicit CudaFusedDecoder(CudaBackend& be) : be_(be) {}
  bool run(const DecoderStackArgs& a, Tensor& x) override { return be_.decoder_stack(a, x); }

 private:
  CudaBackend& be_;
};
}  // namespace

FusedDecoder* CudaBackend::fused_decoder() {
  if (!fused_decoder_) fused_decoder_ = std::make_unique<CudaFusedDecoder>(*this);
  return fused_decoder_.get();
}

void CudaBackend::rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& inv_freq,
                                float attn_factor, const Tensor& slots, const KvTensor& kc, const KvTensor& vc) {
  // (a quantized cache: rope, then kv_write's quantizing kernel)
  if (!impl_->opt.fused || kc.quantized())
    return Backend::rope_kv_write(q, k, v, pos, inv_freq, attn_factor, slots, kc, vc);
  Impl& im = *impl_;
  const char* op = "rope_kv_write";
  const Tensor &k_cache = kc.data, &v_cache = vc.data;
  checks::each(require_act, op, {{q, "q"}, {k, "k"}, {v, "v"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}});
  checks::each(require_i32, op, {{pos, "pos"}, {slots, "slots"}});
  if (inv_freq.dtype != DType::f32) fail("cuda", "rope_kv_write: inv_freq must be float32");
  if (q.ndim() != 3 || k.ndim() != 3 || q.dim(0) != k.dim(0) || q.dim(2) != k.dim(2))
    fail("cuda", "rope_kv_write: q {} and k {} must be [n_tokens, heads, head_dim] of one n_tokens and head_dim",
         shape_str(q.shape), shape_str(k.shape));
  const int64_t n = q.dim(0), hd = q.dim(2), half = inv_freq.numel(), width = k.dim(1) * hd;
  if (pos.numel() != n || slots.numel() != n)
    fail("cuda", "rope_kv_write: {} positions and {} slots for {} tokens", pos.numel(), slots.numel(), n);
  if (2 * half > hd) fail("cuda", "rope_kv_write: rotary dim {} exceeds head_dim {}", 2 * half, hd);
  if (v.numel() != n * width || k_cache.cols() != width || v_cache.cols() != width ||
      k_cache.numel() != v_cache.numel())
    fail("cuda", "rope_kv_write: k {} v {} caches {} {}", shape_str(k.shape), shape_str(v.shape),
         shape_str(k_cache.shape), shape_str(v_cache.shape));
  if (q.dtype != k.dtype || v.dtype != k.dtype || k_cache.dtype != k.dtype || v_cache.dtype != k.dtype)
    fail("cuda", "rope_kv_write: q {}, k {}, v {} and the caches {} / {} must share one dtype", dtype_name(q.dtype),
         dtype_name(k.dtype), dtype_name(v.dtype), dtype_name(k_cache.dtype), dtype_name(v_cache.dtype));
  Tensor f = im.resident_of(inv_freq, op);
  im.note(k_cache.data), im.note(v_cache.data);
  if (im.skip()) return;
  ProfScope ps(im, "rope_kv_write");
  RopeKvArgs a{q.data, k.data, v.data, pos.ptr<int32_t>(), f.ptr<float>(), slots.ptr<int32_t>(), k_cache.data,
               v_cache.data, n, q.dim(1), k.dim(1), hd, half, k_cache.numel() / std::max<int64_t>(1, width),
               attn_factor};
  launch_rope_kv_write(a, dt_of(k, op, "k"), im.stream);
}

void CudaBackend::matmul_multi(const Tensor& x, std::span<const Weight* const> w, std::span<Tensor* const> y) {
  Impl& im = *impl_;
  if (w.size() != y.size() || w.size() > kMaxMultiMatmul)
    fail("cuda", "matmul_multi: {} weights for {} outputs (at most {} pairs)", w.size(), y.size(), kMaxMultiMatmul);
  bool quantized = false;
  for (const Weight* wi : w) quantized |= wi->quantized();
  if (quantized) {  // all 4-bit and few tokens: one launch of the tensor-core GEMV; else one matmul each
    if (w.size() < 2 || !impl_->opt.fused || !quantized_matmul_multi(*this, im, x, w, y)) Backend::matmul_multi(x, w, y);
    return;
  }
  // The fused launch: one token of bf16 x and every weight a dense bf16 matrix that gemv_fast takes
  // (what matmul would run for each pair alone, so the values are the same); else the loop.
  if (w.size() < 2 || !impl_->opt.fused || x.dtype != DType::bf16 || x.rows() != 1 ||
      x.device != Device::cuda || x.empty())
    return Backend::matmul_multi(x, w, y);
  const int64_t in = x.cols();
  GemvFastMulti m;
  std::vector<Tensor> keep;  // device copies of weights and biases, alive for the launch
  for (size_t i = 0; i < w.size(); ++i) {
    const Tensor& wt = w[i]->w;
    Tensor& yi = *y[i];
    if (wt.ndim() != 2 || wt.dtype != DType::bf16 || wt.dim(1) != in) return Backend::matmul_multi(x, w, y);
    require_act(yi, "matmul_multi", "y");
    const int64_t out = wt.dim(0);
    if (yi.numel() != out)
      fail("cuda", "matmul_multi: y[{}] {} for x {} and weight {}", i, shape_str(yi.shape), shape_str(x.shape),
           shape_str(wt.shape));
    if (yi.data == x.data) fail("cuda", "matmul_multi: y[{}] must not alias x", i);
    Tensor W = im.resident_of(wt, "matmul_multi");
    if (!gemv_fast_supported(Dt::bf16, 1, in, W.data, Dt::bf16, x.data)) return Backend::matmul_multi(x, w, y);
    const Tensor& bias = w[i]->bias;
    if (!bias.empty()) {
      if (bias.numel() != out) fail("cuda", "matmul_multi: bias {} for {} outputs", shape_str(bias.shape), out);
      m.bias_t[i] = dt_of(bias, "matmul_multi", "bias");
      keep.push_back(im.resident_of(bias, "matmul_multi"));
      m.bias[i] = keep.back().data;
    }
    m.w[i] = W.data;
    m.out[i] = out;
    m.y[i] = yi.data;
    m.y_t[i] = dt_of(yi, "matmul_multi", "y");
    keep.push_back(std::move(W));
  }
  m.count = static_cast<int>(w.size());
  if (im.skip(y)) return;
  ProfScope ps(im, "matmul_multi (gemv)");
  launch_gemv_fast_multi(x.data, in, m, im.stream);
}

}  // namespace kiln::backend::cuda
