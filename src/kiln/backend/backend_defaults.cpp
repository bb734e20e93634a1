// Default implementations of Backend ops that any backend can express through its buffers or its
// other ops: a reference a backend overrides when it has a faster path (the CUDA backend does).
// The fused ops' defaults are exactly the sequences of ops they replace (the CPU runs these); the
// MoE defaults are the host routing (router logits and expert ids read back to the host).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kiln/backend/backend.h"

namespace kiln::backend {

void Backend::argmax_rows(const Tensor& x, Tensor& ids) {
  if (ids.dtype != DType::i32 || ids.numel() != x.rows())
    fail(name(), "argmax_rows: ids must be int32 [{}], got {} {}", x.rows(), dtype_name(ids.dtype), shape_str(ids.shape));
  Tensor h = to_host(x);
  const int64_t rows = x.rows(), n = x.cols();
  std::vector<float> row(n);
  Tensor out = Tensor::host(DType::i32, {rows});
  for (int64_t r = 0; r < rows; ++r) {
    to_f32(static_cast<const char*>(h.data) + r * n * dtype_size(h.dtype), h.dtype, row.data(), n);
    out.ptr<int32_t>()[r] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  }
  Tensor d = upload(out);
  copy(d, ids);
}

void Backend::add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, bool one_plus_w, Tensor& y) {
  if (delta.numel() != x.numel() || y.numel() != x.numel())
    fail(name(), "add_rms_norm: x {} delta {} y {} must have the same size", shape_str(x.shape),
         shape_str(delta.shape), shape_str(y.shape));
  add(x, delta, x);
  rms_norm(x, w, eps, one_plus_w, y);
}

void Backend::rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& inv_freq,
                            float attn_factor, const Tensor& slots, const KvTensor& k_cache,
                            const KvTensor& v_cache) {
  if (q.ndim() != 3 || k.ndim() != 3 || q.dim(0) != k.dim(0))
    fail(name(), "rope_kv_write: q {} and k {} must be [n_tokens, heads, head_dim] of the same n_tokens",
         shape_str(q.shape), shape_str(k.shape));
  rope(q, pos, inv_freq, attn_factor);
  rope(k, pos, inv_freq, attn_factor);
  const Tensor k2 = k.view({k.dim(0), k.dim(1) * k.dim(2)});  // [n_tokens, n_kv_heads * head_dim]
  kv_write(k2, v, slots, k_cache, v_cache);
}

void Backend::matmul_multi(const Tensor& x, std::span<const Weight* const> w, std::span<Tensor* const> y) {
  if (w.size() != y.size() || w.size() > kMaxMultiMatmul)
    fail(name(), "matmul_multi: {} weights for {} outputs (at most {} pairs)", w.size(), y.size(), kMaxMultiMatmul);
  for (size_t i = 0; i < w.size(); ++i) matmul(x, *w[i], *y[i]);
}

void Backend::gated_mlp(const Tensor& x, const Weight& gate, const Weight& up, const Weight& down, Activation act,
                        Tensor& out) {
  const int64_t n = x.rows(), ffn = gate.out_features();
  Tensor g = alloc(act_dtype(), {n, ffn});  // [n, ffn]
  Tensor u = alloc(act_dtype(), {n, ffn});
  const Weight* gu_w[] = {&gate, &up};
  Tensor* gu_y[] = {&g, &u};
  matmul_multi(x, gu_w, gu_y);
  gated_act(g, u, act, g);
  matmul(g, down, out);
}

// Softmax in double, top-k by probability (ties to the lower index), optional renormalisation over
// the k: what moe_block did on the host before the op existed, so the CPU reference is unchanged.
void Backend::moe_route(const Tensor& logits, int top_k, bool norm_topk_prob, Tensor& ids, Tensor& weights) {
  const int64_t n = logits.rows(), n_experts = logits.cols();
  if (top_k < 1 || top_k > n_experts)
    fail(name(), "moe_route: top_k {} for {} experts (router logits {})", top_k, n_experts, shape_str(logits.shape));
  if (ids.dtype != DType::i32 || ids.numel() != n * top_k || weights.dtype != DType::f32 || weights.numel() != n * top_k)
    fail(name(), "moe_route: ids must be int32 and weights float32 [{}, {}], got {} {} and {} {}", n, top_k,
         dtype_name(ids.dtype), shape_str(ids.shape), dtype_name(weights.dtype), shape_str(weights.shape));
  Tensor lh = to_host(logits);
  std::vector<float> l(n * n_experts);  // [n, E]
  to_f32(lh.data, lh.dtype, l.data(), n * n_experts);
  Tensor ih = Tensor::host(DType::i32, {n, top_k}), wh = Tensor::host(DType::f32, {n, top_k});
  std::vector<int> order(n_experts);
  std::vector<double> prob(n_experts);
  for (int64_t t = 0; t < n; ++t) {
    const float* lt = l.data() + t * n_experts;
    double mx = *std::max_element(lt, lt + n_experts), sum = 0;
    for (int64_t e = 0; e < n_experts; ++e) sum += prob[e] = std::exp(static_cast<double>(lt[e]) - mx);
    for (auto& p : prob) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int a, int b) { return prob[a] > prob[b] || (prob[a] == prob[b] && a < b); });
    double top_sum = 0;
    for (int i = 0; i < top_k; ++i) top_sum += prob[order[i]];
    for (int i = 0; i < top_k; ++i) {
      const int e = order[i];
      ih.ptr<int32_t>()[t * top_k + i] = e;
      wh.ptr<float>()[t * top_k + i] = static_cast<float>(norm_topk_prob ? prob[e] / top_sum : prob[e]);
    }
  }
  Tensor di = upload(ih), dw = upload(wh);
  copy(di, ids);
  copy(dw, weights);
}

// Each expert once over the tokens routed to it (in token order): gather, gated MLP, weighted
// scatter-add into out, experts in increasing index.
void Backend::moe_experts(const Tensor& x, std::span<const ExpertWeights> experts, Activation act, const Tensor& ids,
                          const Tensor& weights, Tensor& out) {
  const int64_t n = x.rows(), dim = x.cols(), n_experts = static_cast<int64_t>(experts.size());
  const int64_t k = n == 0 ? 0 : ids.numel() / n;
  if (ids.dtype != DType::i32 || weights.dtype != DType::f32 || ids.numel() != n * k || weights.numel() != n * k ||
      (n > 0 && k < 1))
    fail(name(), "moe_experts: ids (int32) and weights (float32) must be [{}, top_k], got {} {} and {} {}", n,
         dtype_name(ids.dtype), shape_str(ids.shape), dtype_name(weights.dtype), shape_str(weights.shape));
  if (out.numel() != n * dim) fail(name(), "moe_experts: out {} for x {}", shape_str(out.shape), shape_str(x.shape));
  if (n > 0 && out.data == x.data) fail(name(), "moe_experts: out must not alias x");
  Tensor ih = to_host(ids), wh = to_host(weights);
  std::vector<std::vector<int32_t>> rows(n_experts);  // per expert: its tokens, in token order
  std::vector<std::vector<float>> wts(n_experts);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ih.ptr<int32_t>()[t * k + j];
      if (e < 0 || e >= n_experts)
        fail(name(), "moe_experts: token {} slot {} routes to expert {}, outside [0, {})", t, j, e, n_experts);
      rows[e].push_back(static_cast<int32_t>(t));
      wts[e].push_back(wh.ptr<float>()[t * k + j]);
    }
  fill_zero(out);
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t m = static_cast<int64_t>(rows[e].size());
    if (m == 0) continue;
    const ExpertWeights& ex = experts[e];
    if (!ex.gate || !ex.up || !ex.down) fail(name(), "moe_experts: expert {} lacks gate/up/down weights", e);
    Tensor rh = Tensor::host(DType::i32, {m}), wth = Tensor::host(DType::f32, {m});
    std::copy(rows[e].begin(), rows[e].end(), rh.ptr<int32_t>());
    std::copy(wts[e].begin(), wts[e].end(), wth.ptr<float>());
    Tensor r = upload(rh), wt = upload(wth);
    Tensor xe = alloc(act_dtype(), {m, dim});  // [m_e, dim] this expert's tokens
    Tensor ye = alloc(act_dtype(), {m, dim});
    gather_rows(x, r, xe);
    gated_mlp(xe, *ex.gate, *ex.up, *ex.down, act, ye);
    scatter_add_rows(ye, r, wt, out);
  }
}

}  // namespace kiln::backend
