// The Gemma family: gemma, gemma2, gemma3_text. Differences from Llama, all read from the config
// or the weights: (1 + w) RMSNorms, embeddings scaled by sqrt(hidden_size) in the model dtype,
// attention scale query_pre_attn_scalar^-0.5, norms after attention and MLP too (gemma2/3),
// attention-logit and final-logit softcapping (gemma2), sliding-window layers by layer_types,
// per-head q/k norms and local/global RoPE bases (gemma3), GeGLU with tanh-GELU.
//   x = embed(tokens) * sqrt(dim)
//   per layer: x += post_attn_norm(attn(norm(x))); x += post_ffw_norm(mlp(pre_ffw_norm(x)))
//   logits = softcap(head(norm(x)))
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kiln/model/families.h"
#include "kiln/model/layers.h"

namespace kiln::model {

namespace {

struct GemmaLayer {
  Tensor attn_norm, post_attn_norm, mlp_norm, post_mlp_norm;  // [dim]; post norms empty on gemma 1
  AttentionWeights attn;
  MlpWeights mlp;
  int window = 0;
  int rope = 0;  // index into rope_configs() and StepInputs::ropes (gemma3 local/global)
};

class Gemma final : public Model {
 public:
  Gemma(const ModelConfig& c, const io::WeightSet& ws, backend::Backend& be) : Model(c, be) {
    act_ = activation_from_name(c.hidden_act, "config.json");
    embed_ = load_embedding(ws, c);
    head_ = ws.has("lm_head.weight") && !c.tie_word_embeddings ? load_linear(ws, "lm_head", c) : embed_;
    final_norm_ = load_vector(ws, "model.norm.weight");
    embed_scale_ = round_to_model_dtype(std::sqrt(static_cast<float>(c.dim)), c);
    double pre_attn = json_get<double>(c.raw, "query_pre_attn_scalar", "config.json").value_or(c.head_dim);
    attn_scale_ = static_cast<float>(1.0 / std::sqrt(pre_attn));
    attn_softcap_ = static_cast<float>(json_get<double>(c.raw, "attn_logit_softcapping", "config.json").value_or(0.0));
    final_softcap_ = static_cast<float>(json_get<double>(c.raw, "final_logit_softcapping", "config.json").value_or(0.0));
    for (int i = 0; i < c.n_layers; ++i) {
      std::string p = fmt::format("model.layers.{}.", i);
      GemmaLayer L;
      L.attn_norm = load_vector(ws, p + "input_layernorm.weight");
      L.post_attn_norm = load_vector(ws, p + "post_attention_layernorm.weight");
      L.mlp_norm = load_vector(ws, p + "pre_feedforward_layernorm.weight", false);
      L.post_mlp_norm = load_vector(ws, p + "post_feedforward_layernorm.weight", false);
      if (L.mlp_norm.empty()) {  // gemma 1: post_attention_layernorm is the MLP's pre-norm
        L.mlp_norm = L.post_attn_norm;
        L.post_attn_norm = {};
      }
      L.attn = load_attention(ws, p + "self_attn.", c);
      L.mlp = load_mlp(ws, p + "mlp.", c);
      L.window = c.layer_is_sliding(i) ? c.sliding_window : 0;
      const RopeConfig* r = &config_.rope_for_layer(i);  // config_, which lives as long as the model
      auto it = std::find(rope_cfgs_.begin(), rope_cfgs_.end(), r);
      L.rope = static_cast<int>(it - rope_cfgs_.begin());
      if (it == rope_cfgs_.end()) rope_cfgs_.push_back(r);
      layers_.push_back(std::move(L));
    }
  }

  Tensor forward(const StepInputs& in, KvCache& cache) override {
    backend::Backend& be = *backend_;
    const ModelConfig& c = config_;
    const int64_t n = in.n_tokens;
    const DType t = be.act_dtype();
    const std::vector<DeviceRope>& ropes = in.ropes;

    Tensor x = be.alloc(t, {n, c.dim});  // [n_tokens, dim] the residual stream
    Tensor h = be.alloc(t, {n, c.dim});
    Tensor y = be.alloc(t, {n, c.dim});
    be.embedding(embed_, in.tokens, x);
    be.scale(x, embed_scale_);

    AttentionOptions ao;
    ao.scale = attn_scale_;
    ao.softcap = attn_softcap_;
    ao.norm_one_plus = true;
    ao.norm_eps = c.rms_norm_eps;
    const float eps = static_cast<float>(c.rms_norm_eps);
    // Residual adds fused with the norm after them (add_rms_norm), as in llama.cpp: a layer's MLP
    // output y is added at the next layer's attention norm, the last one at the final norm.
    for (const GemmaLayer& L : layers_) {
      cache.layer_mask(L.window, ao.window, ao.sink);
      ao.inv_freq = ropes[L.rope].inv_freq;
      ao.rope_attn_factor = ropes[L.rope].attn_factor;
      if (&L == layers_.data()) be.rms_norm(x, L.attn_norm, eps, true, h);
      else be.add_rms_norm(x, y, L.attn_norm, eps, true, h);  // x += previous MLP output
      attention_block(be, c, L.attn, ao, h, in, cache.k[&L - layers_.data()], cache.v[&L - layers_.data()], cache.block_size, y);
      if (!L.post_attn_norm.empty()) be.rms_norm(y, L.post_attn_norm, eps, true, y);
      be.add_rms_norm(x, y, L.mlp_norm, eps, true, h);  // x += attention output
      mlp_block(be, L.mlp, act_, h, y);
      if (!L.post_mlp_norm.empty()) be.rms_norm(y, L.post_mlp_norm, eps, true, y);
    }
    return output_logits(be, x, in, final_norm_, eps, true, head_, final_softcap_, layers_.empty() ? nullptr : &y);
  }

 private:
  backend::Activation act_;
  backend::Weight embed_, head_;
  Tensor final_norm_;
  float embed_scale_ = 1, attn_scale_ = 1, attn_softcap_ = 0, final_softcap_ = 0;
  std::vector<GemmaLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> create_gemma(const ModelConfig& c, const io::WeightSet& w, backend::Backend& be) {
  return std::make_unique<Gemma>(c, w, be);
}

}  // namespace kiln::model
