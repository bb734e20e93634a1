// MoE block. Shapes: x [n, dim]; router logits [n, n_experts] -> ids, weights [n, top_k] (moe_route)
// -> out [n, dim] (moe_experts; the default runs per expert e with m_e tokens xe [m_e, dim] ->
// gate/up [m_e, ffn] -> ye [m_e, dim], scattered into out).
// Weights: per-expert modules, or mlx-lm's stacked switch_mlp tensors [n_experts, out, in] viewed per expert.
#include "kiln/model/moe.h"

#include <optional>

#include "kiln/quant/affine.h"

namespace kiln::model {

Tensor expert_view(const Tensor& t, int64_t e) {
  KILN_ASSERT(t.ndim() == 3 && e >= 0 && e < t.dim(0), "expert {} of {}", e, shape_str(t.shape));
  // [n_experts, rows, cols] viewed as [n_experts * rows, cols]: expert e is rows [e * rows, (e + 1) * rows).
  return t.view({t.dim(0) * t.dim(1), t.dim(2)}).slice_rows(e * t.dim(1), (e + 1) * t.dim(1));
}

namespace {

// One stacked SwitchLinear at `path` (no ".weight"): n_experts per-expert Weights viewing its tensors.
std::vector<backend::Weight> load_stacked(const io::WeightSet& ws, const std::string& path, const ModelConfig& c,
                                          int64_t n_experts) {
  const Tensor& w = ws.get(path + ".weight");
  if (w.ndim() != 3 || w.dim(0) != n_experts)
    fail("weights", "{}.weight has shape {}; mlx-lm's stacked experts are [n_experts = {}, out, in] (the router "
         "{}gate has {} rows)", path, shape_str(w.shape), n_experts, path.substr(0, path.find("switch_mlp.")), n_experts);
  const bool has_scales = ws.has(path + ".scales");
  std::optional<quant::QuantParams> qp;
  if (c.quant) qp = c.quant->for_module(path, has_scales);
  if (qp && !has_scales)
    fail("weights", "{}: config.json's quantization section says {}-bit, but {}.scales is missing", path, qp->bits, path);
  if (has_scales && !qp)
    fail("weights", "{} has .scales (a quantized layer) but config.json has no quantization section for it; "
         "add mlx-lm's \"quantization\": {{\"group_size\": ..., \"bits\": ...}}", path);
  Tensor scales, biases, bias;
  if (qp) {
    scales = ws.get(path + ".scales");
    biases = ws.get(path + ".biases");
    for (const Tensor* t : {&scales, &biases})
      if (t->ndim() != 3 || t->dim(0) != w.dim(0) || t->dim(1) != w.dim(1))
        fail("weights", "{}: .scales/.biases have shapes {} / {}; with .weight {} they must be [{}, {}, in / group_size]",
             path, shape_str(scales.shape), shape_str(biases.shape), shape_str(w.shape), w.dim(0), w.dim(1));
    // Rows are quantized independently, so the [n_experts * out, ...] views have the 2-D layout.
    const int64_t rows = w.dim(0) * w.dim(1);
    quant::check_layout(w.view({rows, w.dim(2)}), scales.view({rows, scales.dim(2)}),
                        biases.view({rows, biases.dim(2)}), qp->bits, qp->group_size, path);
  } else if (w.dtype != DType::f32 && w.dtype != DType::bf16 && w.dtype != DType::f16) {
    fail("weights", "{}.weight has dtype {}; expected float32, bfloat16 or float16", path, dtype_name(w.dtype));
  }
  if (const Tensor* b = ws.find(path + ".bias")) {  // SwitchLinear(bias=True): [n_experts, out]
    if (b->ndim() != 2 || b->dim(0) != w.dim(0) || b->dim(1) != w.dim(1))
      fail("weights", "{}.bias has shape {}; expected [{}, {}]", path, shape_str(b->shape), w.dim(0), w.dim(1));
    bias = *b;
  }
  std::vector<backend::Weight> out(n_experts);
  for (int64_t e = 0; e < n_experts; ++e) {
    backend::Weight& x = out[e];
    x.w = expert_view(w, e);
    if (!bias.empty()) x.bias = bias.slice_rows(e, e + 1).view({w.dim(1)});
    if (qp) {
      x.scales = expert_view(scales, e);
      x.biases = expert_view(biases, e);
      x.bits = qp->bits;
      x.group_size = qp->group_size;
    }
  }
  return out;
}

}  // namespace

MoeWeights load_moe(const io::WeightSet& ws, const std::string& p, const ModelConfig& c) {
  MoeWeights m;
  m.router = load_linear(ws, p + "gate", c);
  const int n_experts = static_cast<int>(m.router.out_features());
  if (n_experts < 1) fail("weights", "{}gate.weight has no rows: a MoE router needs one row per expert", p);
  const std::string sw = p + "switch_mlp.";
  if (ws.has(sw + "gate_proj.weight")) {  // mlx-lm's layout (what mlx_lm.convert and kiln convert write)
    if (ws.has(p + "experts.0.gate_proj.weight") || ws.has(p + "experts.0.w1.weight"))
      fail("weights", "{}: both per-expert ({}experts.*) and stacked ({}*) tensors; keep one layout", ws.dir(), p, sw);
    auto gate = load_stacked(ws, sw + "gate_proj", c, n_experts);
    auto up = load_stacked(ws, sw + "up_proj", c, n_experts);
    auto down = load_stacked(ws, sw + "down_proj", c, n_experts);
    const int64_t ffn = gate[0].out_features();
    if (gate[0].in_features() != c.dim || up[0].in_features() != c.dim || up[0].out_features() != ffn ||
        down[0].in_features() != ffn || down[0].out_features() != c.dim)
      fail("weights", "{}: stacked experts gate/up [{}, {}] and down [{}, {}] per expert; with hidden_size {} they "
           "must be gate/up [ffn, {}] and down [{}, ffn]", sw, gate[0].out_features(), gate[0].in_features(),
           down[0].out_features(), down[0].in_features(), c.dim, c.dim, c.dim);
    for (int e = 0; e < n_experts; ++e) m.experts.push_back({gate[e], up[e], down[e]});
  } else {
    for (int e = 0; e < n_experts; ++e) m.experts.push_back(load_mlp(ws, p + "experts." + std::to_string(e) + ".", c));
  }
  m.top_k = json_get<int>(c.raw, "num_experts_per_tok", "config.json").value_or(2);
  m.norm_topk_prob = c.model_type == "mixtral" ? true : json_get<bool>(c.raw, "norm_topk_prob", "config.json").value_or(false);
  if (m.top_k < 1 || m.top_k > n_experts)
    fail("config", "num_experts_per_tok is {} but the layer has {} experts", m.top_k, n_experts);
  return m;
}

std::vector<backend::ExpertWeights> expert_refs(const MoeWeights& w) {
  std::vector<backend::ExpertWeights> r(w.experts.size());
  for (size_t e = 0; e < w.experts.size(); ++e) r[e] = {&w.experts[e].gate, &w.experts[e].up, &w.experts[e].down};
  return r;
}

bool moe_block_on_device(const backend::Backend& be, const MoeWeights& w, int64_t n_tokens) {
  return be.moe_on_device(expert_refs(w), n_tokens);
}

void moe_block(backend::Backend& be, const MoeWeights& w, backend::Activation act, const Tensor& x, Tensor& out) {
  const int64_t n = x.dim(0);
  const int n_experts = static_cast<int>(w.experts.size()), k = w.top_k;
  Tensor logits = be.alloc(be.act_dtype(), {n, n_experts});  // [n, E] router logits
  be.matmul(x, w.router, logits);
  Tensor ids = be.alloc(DType::i32, {n, k});      // [n, k] chosen experts, best first
  Tensor weights = be.alloc(DType::f32, {n, k});  // [n, k] their mixing weights
  be.moe_route(logits, k, w.norm_topk_prob, ids, weights);
  be.moe_experts(x, expert_refs(w), act, ids, weights, out);
}

}  // namespace kiln::model
