// MoE block. Shapes: x [n, dim]; router logits [n, n_experts]; per expert e with m_e tokens:
// xe [m_e, dim] -> gate/up [m_e, ffn] -> ye [m_e, dim], scattered into out [n, dim].
#include "kiln/model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace kiln::model {

MoeWeights load_moe(const io::WeightSet& ws, const std::string& p, const ModelConfig& c) {
  MoeWeights m;
  m.router = load_linear(ws, p + "gate", c);
  int n_experts = static_cast<int>(m.router.out_features());
  for (int e = 0; e < n_experts; ++e) m.experts.push_back(load_mlp(ws, p + "experts." + std::to_string(e) + ".", c));
  m.top_k = json_get<int>(c.raw, "num_experts_per_tok", "config.json").value_or(2);
  m.norm_topk_prob = c.model_type == "mixtral" ? true : json_get<bool>(c.raw, "norm_topk_prob", "config.json").value_or(false);
  if (m.top_k < 1 || m.top_k > n_experts)
    fail("config", "num_experts_per_tok is {} but the layer has {} experts", m.top_k, n_experts);
  return m;
}

static Tensor upload_vec(backend::Backend& be, DType t, const void* data, int64_t n) {
  Tensor h = Tensor::host(t, {n});
  std::memcpy(h.data, data, n * dtype_size(t));
  return be.upload(h);
}

void moe_block(backend::Backend& be, const MoeWeights& w, backend::Activation act, const Tensor& x, Tensor& out) {
  const int64_t n = x.dim(0), dim = x.dim(1);
  const int n_experts = static_cast<int>(w.experts.size()), k = w.top_k;
  Tensor logits_dev = be.alloc(be.act_dtype(), {n, n_experts});
  be.matmul(x, w.router, logits_dev);
  Tensor logits_host = be.to_host(logits_dev);
  std::vector<float> logits(n * n_experts);
  to_f32(logits_host.data, logits_host.dtype, logits.data(), n * n_experts);

  // Per expert: the tokens routed to it and their weights.
  std::vector<std::vector<int32_t>> rows(n_experts);
  std::vector<std::vector<float>> weights(n_experts);
  std::vector<int> order(n_experts);
  std::vector<double> prob(n_experts);
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits.data() + t * n_experts;
    double mx = *std::max_element(l, l + n_experts), sum = 0;
    for (int e = 0; e < n_experts; ++e) sum += prob[e] = std::exp(static_cast<double>(l[e]) - mx);
    for (auto& p : prob) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return prob[a] > prob[b] || (prob[a] == prob[b] && a < b); });
    double top_sum = 0;
    for (int i = 0; i < k; ++i) top_sum += prob[order[i]];
    for (int i = 0; i < k; ++i) {
      int e = order[i];
      rows[e].push_back(static_cast<int32_t>(t));
      weights[e].push_back(static_cast<float>(w.norm_topk_prob ? prob[e] / top_sum : prob[e]));
    }
  }

  be.fill_zero(out);
  for (int e = 0; e < n_experts; ++e) {
    const int64_t m = static_cast<int64_t>(rows[e].size());
    if (m == 0) continue;
    Tensor r = upload_vec(be, DType::i32, rows[e].data(), m);
    Tensor wt = upload_vec(be, DType::f32, weights[e].data(), m);
    Tensor xe = be.alloc(be.act_dtype(), {m, dim});  // [m_e, dim] this expert's tokens
    Tensor ye = be.alloc(be.act_dtype(), {m, dim});
    be.gather_rows(x, r, xe);
    mlp_block(be, w.experts[e], act, xe, ye);
    be.scatter_add_rows(ye, r, wt, out);
  }
}

}  // namespace kiln::model
