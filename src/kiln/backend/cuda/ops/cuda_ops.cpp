// CudaBackend ops: argument checks ("[cuda] <op>: ..."), weight residency, and dispatch to the
// kernels (kernels.h) or cuBLASLt. In graph replay mode an op checks its arguments and returns:
// the captured graph does the work. Matmul: the weight-streaming GEMV for up to 8 tokens or
// non-bf16 operands, cuBLASLt (bf16 in, f32 accumulate, bias fused) for larger bf16 batches.
#include <algorithm>
#include <cmath>

#include "kiln/backend/checks.h"
#include "kiln/backend/cuda/core/cuda_impl.h"
#include "kiln/backend/cuda/quant/cuda_qops.h"

namespace kiln::backend::cuda {

void require_device(const Tensor& t, const char* op, const char* arg) {
  if (t.empty() && t.numel() != 0) fail("cuda", "{}: {} is empty", op, arg);
  if (t.device != Device::cuda && t.numel() != 0)
    fail("cuda", "{}: {} is in host memory; upload it first", op, arg);
}
void require_i32(const Tensor& t, const char* op, const char* arg) {
  require_device(t, op, arg);
  if (t.dtype != DType::i32) fail("cuda", "{}: {} must be int32, got {}", op, arg, dtype_name(t.dtype));
}
void require_act(const Tensor& t, const char* op, const char* arg) {
  require_device(t, op, arg);
  if (t.dtype != DType::bf16 && t.dtype != DType::f32)
    fail("cuda", "{}: {} must be bfloat16 (or float32), got {}", op, arg, dtype_name(t.dtype));
}

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    default: return CUDA_R_16F;
  }
}

int alignment(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && v % a) a /= 2;
  return a;
}

}  // namespace

void CudaBackend::embedding(const Weight& table, const Tensor& ids, Tensor& out) {
  Impl& im = *impl_;
  if (table.quantized()) return quantized_embedding(*this, im, table, ids, out);  // cuda_qops.cpp
  require_i32(ids, "embedding", "ids");
  require_act(out, "embedding", "out");
  const Tensor& w = table.w;
  checks::float_matrix("cuda", "embedding", "table", w);
  const Dt wt = dt_of(w, "embedding", "table");
  const int64_t n = ids.numel(), vocab = w.dim(0), dim = w.dim(1);
  checks::embedding_out("cuda", out, n, dim);
  Tensor wd = im.resident_of(w, "embedding");
  if (im.skip()) return;
  ProfScope ps(im, "embedding");
  launch_embedding(wd.data, wt, vocab, dim, ids.ptr<int32_t>(), n, out.data, dt_of(out, "embedding", "out"), im.stream);
}

void CudaBackend::matmul(const Tensor& x, const Weight& w, Tensor& y) {
  Impl& im = *impl_;
  if (w.quantized()) return quantized_matmul(*this, im, x, w, y);  // cuda_qops.cpp
  checks::each(require_act, "matmul", {{x, "x"}, {y, "y"}});
  const Tensor& wt = w.w;
  checks::float_matrix("cuda", "matmul", "weight", wt);
  const Dt wdt = dt_of(wt, "matmul", "weight");
  const int64_t out = wt.dim(0), in = wt.dim(1), n = x.rows();
  checks::matmul("cuda", x, wt.shape, in, out, w.bias, y);
  Tensor W = im.resident_of(wt, "matmul");
  Tensor B = im.resident_of(w.bias, "matmul");  // empty without a bias
  if (im.skip(y) || n == 0) return;
  // The GEMV streams the weight once per 8 tokens: right for one token; for 2+ tokens of bf16
  // cuBLASLt is faster (measured on the H200: the 8-token GEMV ran batch-8 decode at 25 ms a step).
  const bool gemv = n == 1 || wt.dtype != DType::bf16 || x.dtype != DType::bf16;
  ProfScope ps(im, gemv ? "matmul (gemv)" : "matmul (gemm)");
  const Dt xdt = dt_of(x, "matmul", "x"), ydt = dt_of(y, "matmul", "y");
  if (gemv) {
    launch_gemv(x.data, xdt, n, in, W.data, wdt, out, B.empty() ? nullptr : B.data,
                B.empty() ? Dt::f32 : dt_of(B, "matmul", "bias"), y.data, ydt, im.stream);
    return;
  }
  // cuBLASLt, column-major view of row-major data: yᵀ [out, n] = W [in, out]ᵀ · xᵀ [in, n].
  const bool fuse_bias = !B.empty() && B.dtype == y.dtype;
  const int align = std::min({alignment(W.data), alignment(x.data), alignment(y.data)});
  GemmKey key{out, n, in, static_cast<int>(y.dtype), fuse_bias ? 1 : 0, align};
  auto it = im.gemm_plans.find(key);
  if (it == im.gemm_plans.end()) {
    GemmPlan p;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (fuse_bias) {
      cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
      cudaDataType_t bt = cuda_type(B.dtype);
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, in, out, in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, in, n, in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(y.dtype), out, n, out));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &im.workspace_bytes, sizeof(im.workspace_bytes)));
    uint32_t al = static_cast<uint32_t>(align);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(im.lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) fail("cuda", "matmul: cuBLASLt has no algorithm for [{} x {}] · [{} x {}]ᵀ", n, in, out, in);
    p.algo = res.algo;
    it = im.gemm_plans.emplace(key, p).first;
  }
  GemmPlan& p = it->second;
  if (fuse_bias) {
    const void* bp = B.data;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(im.lt, p.op, &alpha, W.data, p.a, x.data, p.b, &beta, y.data, p.c, y.data, p.c, &p.algo,
                              im.workspace, im.workspace_bytes, im.stream));
  if (!B.empty() && !fuse_bias) launch_add_bias(y.data, ydt, n, out, B.data, dt_of(B, "matmul", "bias"), im.stream);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, bool one_plus_w, Tensor& y) {
  Impl& im = *impl_;
  checks::each(require_act, "rms_norm", {{x, "x"}, {y, "y"}});
  checks::rms_norm("cuda", x, w, y);
  const int64_t dim = x.cols(), rows = x.rows();
  const Dt wt = dt_of(w, "rms_norm", "w");
  Tensor W = im.resident_of(w, "rms_norm");
  QxOut qx;  // y's quantized form for a 4-bit GEMV, written by the same kernel
  if (im.skip_producing(y, qx)) return;
  ProfScope ps(im, "rms_norm");
  launch_rms_norm(x.data, dt_of(x, "rms_norm", "x"), W.data, wt, eps, one_plus_w, rows, dim, y.data,
                  dt_of(y, "rms_norm", "y"), im.stream, qx);
}

void CudaBackend::rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, float attn_factor) {
  Impl& im = *impl_;
  require_act(x, "rope", "x");
  require_i32(pos, "rope", "pos");
  checks::rope("cuda", x, pos, inv_freq);
  const int64_t n = x.dim(0), heads = x.dim(1), hd = x.dim(2), half = inv_freq.numel();
  Tensor f = im.resident_of(inv_freq, "rope");
  if (im.skip()) return;
  ProfScope ps(im, "rope");
  launch_rope(x.data, dt_of(x, "rope", "x"), n, heads, hd, pos.ptr<int32_t>(), f.ptr<float>(), half, attn_factor,
              im.stream);
}

void CudaBackend::kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, const KvTensor& kc,
                           const KvTensor& vc) {
  Impl& im = *impl_;
  if (kc.quantized()) {  // each row quantized once, here
    checks::each(require_act, "kv_write", {{k, "k"}, {v, "v"}});
    require_i32(slots, "kv_write", "slots");
    checks::kv_write("cuda", k, v, slots, kc, vc);
    for (const KvTensor* c : {&kc, &vc})
      for (const Tensor* t : {&c->data, &c->scales, &c->biases}) require_device(*t, "kv_write", "quantized cache"), im.note(t->data);
    if (im.skip()) return;
    ProfScope ps(im, "kv_write (quantized)");
    launch_kv_write_quant(k.data, v.data, dt_of(k, "kv_write", "k"), slots.numel(), k.cols(), slots.ptr<int32_t>(),
                          kc.n_rows(), {kc.data.data, kc.scales.data, kc.biases.data},
                          {vc.data.data, vc.scales.data, vc.biases.data}, kc.quant.bits, kc.quant.group_size,
                          im.stream);
    return;
  }
  const Tensor &k_cache = kc.data, &v_cache = vc.data;
  checks::each(require_act, "kv_write", {{k, "k"}, {v, "v"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}});
  require_i32(slots, "kv_write", "slots");
  checks::kv_write("cuda", k, v, slots, k_cache, v_cache);
  const int64_t n = slots.numel(), width = k.cols();
  im.note(k_cache.data), im.note(v_cache.data);
  if (im.skip()) return;
  ProfScope ps(im, "kv_write");
  launch_kv_write(k.data, v.data, dt_of(k, "kv_write", "k"), n, width, slots.ptr<int32_t>(), k_cache.numel() / std::max<int64_t>(1, width),
                  k_cache.data, v_cache.data, dt_of(k_cache, "kv_write", "k_cache"), im.stream);
}

void CudaBackend::attention(const Tensor& q, const KvTensor& kc, const KvTensor& vc, const Tensor& block_tables,
                            const Tensor& token_seq, const Tensor& token_pos, const AttnParams& p, Tensor& out) {
  Impl& im = *impl_;
  const Tensor &k_cache = kc.data, &v_cache = vc.data;
  for (const Tensor* t : {&q, static_cast<const Tensor*>(&out)}) {
    require_device(*t, "attention", "q/out");
    if (t->dtype != DType::bf16) fail("cuda", "attention: q and out must be bfloat16, got {}", dtype_name(t->dtype));
  }
  for (const KvTensor* c : {&kc, &vc}) {
    require_device(c->data, "attention", "caches");
    if (!c->quantized() && c->data.dtype != DType::bf16)
      fail("cuda", "attention: float caches must be bfloat16, got {}", dtype_name(c->data.dtype));
    if (c->quantized()) require_device(c->scales, "attention", "cache scales"), require_device(c->biases, "attention", "cache biases");
  }
  checks::each(require_i32, "attention", {{block_tables, "block_tables"}, {token_seq, "token_seq"},
                                          {token_pos, "token_pos"}});
  checks::attention("cuda", q, kc, vc, block_tables, token_seq, token_pos, p, out);
  if (p.head_dim > 256 || p.n_heads / p.n_kv_heads > 16 || p.head_dim % 2 != 0)
    fail("cuda", "attention: unsupported params n_heads={} n_kv_heads={} head_dim={}", p.n_heads, p.n_kv_heads,
         p.head_dim);
  const int64_t n = token_seq.numel();
  im.note(k_cache.data), im.note(v_cache.data);
  AttnArgs a{q.data, k_cache.data, v_cache.data, block_tables.ptr<int32_t>(), token_seq.ptr<int32_t>(),
             token_pos.ptr<int32_t>(), out.data, static_cast<int>(n),
             static_cast<int>(block_tables.numel() / p.max_blocks), p.n_heads, p.n_kv_heads, p.head_dim, p.scale,
             p.softcap, p.window, p.block_size, p.max_blocks, p.sink};
  if (kc.quantized()) {
    a.kv_bits = kc.quant.bits, a.kv_group = kc.quant.group_size;
    a.k_scales = kc.scales.data, a.k_biases = kc.biases.data, a.v_scales = vc.scales.data, a.v_biases = vc.biases.data;
    for (const void* ptr : {a.k_scales, a.k_biases, a.v_scales, a.v_biases}) im.note(ptr);
  }
  // Kernel choice from host-known sizes only (a graph replays the same choice): the tensor-core
  // kernel when sequences bring 8+ query tokens on average.
  bool prefill = attention_prefill_supported(p.head_dim) && n >= 8 * std::max(1, a.n_seqs);
  if (im.attn_kernel == AttnKernel::decode) prefill = false;
  if (im.attn_kernel == AttnKernel::prefill && attention_prefill_supported(p.head_dim)) prefill = true;
  if (prefill) {
    if (im.skip() || n == 0) return;
    ProfScope ps(im, "attention (prefill)");
    launch_attention_prefill(a, im.stream);
    return;
  }
  // Keys visible to a token are at most max_keys = max_blocks * block_size (the engine rounds
  // max_blocks up to a power of two of the batch's longest table, so this is within 2x of the real
  // context) or the window and its sink.
  int64_t max_keys = int64_t{p.max_blocks} * p.block_size;
  if (p.window > 0) max_keys = std::min<int64_t>(max_keys, int64_t{p.window} + std::max(p.sink, 0));
  const AttnDecodePlan plan = attention_decode_plan(a, max_keys, im.n_sms);
  const int64_t splits = plan.n_splits;
  Tensor partials;
  if (splits > 1) partials = alloc(DType::f32, {attention_partials_floats(a, static_cast<int>(splits))});
  // The tiled and quantized kernels' last block per (token, kv head chunk) merges the splits (no
  // combine launch); the tiled one, decoding for 4-bit weights, also writes the o projection's
  // quantized input (skip_producing).
  const bool tiled = attention_decode_tiled(a);
  unsigned* counters = (tiled || attention_decode_quantized(a)) && splits > 1 && splits <= kAttnFusedMaxSplits &&
                               n * p.n_kv_heads * plan.chunks <= im.attn_counters_n
                           ? im.attn_counters
                           : nullptr;
  QxOut qx;
  const bool want_qx =
      tiled && (splits == 1 || counters) && im.q4_group > 0 && attention_decode_qx_ok(a, plan.chunks, im.q4_group);
  if (im.skip_producing(out, qx, want_qx) || n == 0) return;
  ProfScope ps(im, "attention (decode)");
  launch_attention_decode(a, plan, splits > 1 ? partials.ptr<float>() : nullptr, counters, qx, im.stream);
}

void CudaBackend::gated_act(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) {
  Impl& im = *impl_;
  checks::each(require_act, "gated_act", {{gate, "gate"}, {up, "up"}, {out, "out"}});
  checks::gated_act("cuda", gate, up, out);
  const int64_t n = gate.numel();
  QxOut qx;  // out's quantized form for a 4-bit GEMV, written by the same kernel
  if (im.skip_producing(out, qx)) return;
  ProfScope ps(im, "gated_act");
  launch_gated_act(gate.data, up.data, static_cast<int>(act), n, out.data, dt_of(gate, "gated_act", "gate"), im.stream,
                   out.cols(), qx, qx.base ? im.next_gemv_prefetch() : L2Prefetch());
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& y) {
  Impl& im = *impl_;
  checks::each(require_act, "add", {{a, "a"}, {b, "b"}, {y, "y"}});
  checks::add("cuda", a, b, y);
  const int64_t n = a.numel();
  if (im.skip()) return;
  ProfScope ps(im, "add");
  launch_add(a.data, b.data, y.data, n, dt_of(a, "add", "a"), im.stream);
}

void CudaBackend::scale(Tensor& x, float s) {
  Impl& im = *impl_;
  require_act(x, "scale", "x");
  if (im.skip()) return;
  ProfScope ps(im, "scale");
  launch_scale(x.data, x.numel(), s, dt_of(x, "scale", "x"), im.stream);
}

void CudaBackend::softcap(Tensor& x, float cap) {
  Impl& im = *impl_;
  require_act(x, "softcap", "x");
  checks::softcap("cuda", cap);
  if (im.skip()) return;
  ProfScope ps(im, "softcap");
  launch_softcap(x.data, x.numel(), cap, dt_of(x, "softcap", "x"), im.stream);
}

void CudaBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  Impl& im = *impl_;
  checks::each(require_device, "gather_rows", {{x, "x"}, {out, "out"}});
  require_i32(rows, "gather_rows", "rows");
  checks::gather_rows("cuda", x, rows, out);
  const int64_t n_out = rows.numel(), d = x.cols();
  if (im.skip()) return;
  ProfScope ps(im, "gather_rows");
  launch_gather_rows(x.data, d * static_cast<int64_t>(dtype_size(x.dtype)), rows.ptr<int32_t>(), n_out, x.rows(),
                     out.data, im.stream);
}

void CudaBackend::scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
  Impl& im = *impl_;
  checks::each(require_device, "scatter_rows", {{src, "src"}, {dst, "dst"}});
  require_i32(rows, "scatter_rows", "rows");
  checks::scatter_rows("cuda", src, rows, dst);
  if (im.skip()) return;
  ProfScope ps(im, "scatter_rows");
  launch_scatter_rows(src.data, dst.cols() * static_cast<int64_t>(dtype_size(dst.dtype)), rows.ptr<int32_t>(), rows.numel(),
                      dst.rows(), dst.data, im.stream);
}

void CudaBackend::scatter_add_rows(const Tensor& src, const Tensor& rows, const Tensor& weights, Tensor& dst) {
  Impl& im = *impl_;
  checks::each(require_act, "scatter_add_rows", {{src, "src"}, {dst, "dst"}});
  require_i32(rows, "scatter_add_rows", "rows");
  require_device(weights, "scatter_add_rows", "weights");
  const int64_t m = src.rows(), d = src.cols();
  if (weights.dtype != DType::f32 || dst.cols() != d || rows.numel() != m || weights.numel() != m ||
      src.dtype != dst.dtype)
    fail("cuda", "scatter_add_rows: src {} rows {} weights {} dst {}", shape_str(src.shape), rows.numel(),
         weights.numel(), shape_str(dst.shape));
  if (im.skip()) return;
  ProfScope ps(im, "scatter_add_rows");
  launch_scatter_add_rows(src.data, rows.ptr<int32_t>(), weights.ptr<float>(), m, d, dst.rows(), dst.data,
                          dt_of(dst, "scatter_add_rows", "dst"), im.stream);
}

void CudaBackend::argmax_rows(const Tensor& x, Tensor& ids) {
  Impl& im = *impl_;
  require_device(x, "argmax_rows", "x");
  require_i32(ids, "argmax_rows", "ids");
  if (ids.numel() != x.rows()) fail("cuda", "argmax_rows: ids {} for {} rows", ids.numel(), x.rows());
  const Dt t = dt_of(x, "argmax_rows", "x");
  const size_t scratch = argmax_scratch_bytes(x.rows(), x.cols());
  Tensor part = scratch ? alloc(DType::u8, {static_cast<int64_t>(scratch)}) : Tensor();  // also on replay
  if (im.skip()) return;
  ProfScope ps(im, "argmax_rows");
  launch_argmax_rows(x.data, t, x.rows(), x.cols(), ids.ptr<int32_t>(), part.data, im.stream);
}

Tensor CudaBackend::convert(const Tensor& t, DType to) {
  Impl& im = *impl_;
  Tensor src = t.device == Device::cuda ? t : upload(t);
  Tensor d = alloc(to, t.shape);
  launch_convert(src.data, dt_of(src, "convert", "src"), d.data, dt_of(d, "convert", "dst"), t.numel(), im.stream);
  return d;
}

}  // namespace kiln::backend::cuda
