// The Llama family: llama (default / linear / dynamic / llama3 / yarn RoPE), mistral (sliding
// window), qwen2 (q/k/v biases, found by weight presence), qwen3 (per-head q/k RMSNorm) and
// phi3 (fused qkv_proj and gate_up_proj, split into zero-copy row views at load), and the MoE
// variants qwen3_moe and mixtral (a sparse MoE block in place of the MLP; see moe.h).
//   x = embed(tokens); per layer: x += attn(norm(x)); x += mlp(norm(x)); logits = head(norm(x)).
// (Each add runs fused with the norm after it: Backend::add_rms_norm.)
#include <fmt/format.h>

#include <optional>

#include "kiln/model/families.h"
#include "kiln/model/layers.h"
#include "kiln/model/moe.h"

namespace kiln::model {

namespace {

using backend::Weight;

struct LlamaLayer {
  Tensor attn_norm, mlp_norm;  // [dim]
  AttentionWeights attn;
  MlpWeights mlp;
  std::optional<MoeWeights> moe;  // replaces mlp on sparse layers
  int window = 0;
};

class Llama final : public Model {
 public:
  Llama(const ModelConfig& c, const io::WeightSet& ws, backend::Backend& be) : Model(c, be) {
    rope_cfgs_ = {&config_.rope};
    act_ = activation_from_name(c.hidden_act, "config.json");
    embed_ = load_embedding(ws, c);
    final_norm_ = load_vector(ws, "model.norm.weight");
    if (ws.has("lm_head.weight") && !c.tie_word_embeddings) head_ = load_linear(ws, "lm_head", c);
    else head_ = embed_;
    for (int i = 0; i < c.n_layers; ++i) {
      std::string p = fmt::format("model.layers.{}.", i);
      LlamaLayer L;
      L.attn_norm = load_vector(ws, p + "input_layernorm.weight");
      L.mlp_norm = load_vector(ws, p + "post_attention_layernorm.weight");
      L.attn = load_attention(ws, p + "self_attn.", c);
      if (ws.has(p + "block_sparse_moe.gate.weight")) L.moe = load_moe(ws, p + "block_sparse_moe.", c);
      else if (ws.has(p + "mlp.gate.weight")) L.moe = load_moe(ws, p + "mlp.", c);
      else L.mlp = load_mlp(ws, p + "mlp.", c);
      L.window = c.layer_is_sliding(i) ? c.sliding_window : 0;
      has_moe_ |= L.moe.has_value();
      layers_.push_back(std::move(L));
    }
  }

  Tensor forward(const StepInputs& in, KvCache& cache) override {
    backend::Backend& be = *backend_;
    const ModelConfig& c = config_;
    const int64_t n = in.n_tokens;
    const DType t = be.act_dtype();
    const DeviceRope& rope = in.ropes[0];

    Tensor x = be.alloc(t, {n, c.dim});    // [n_tokens, dim] the residual stream
    Tensor h = be.alloc(t, {n, c.dim});    // normed input of a block
    Tensor y = be.alloc(t, {n, c.dim});    // a block's output
    be.embedding(embed_, in.tokens, x);

    AttentionOptions ao;
    ao.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    ao.norm_eps = c.rms_norm_eps;
    ao.inv_freq = rope.inv_freq;
    ao.rope_attn_factor = rope.attn_factor;
    const float eps = static_cast<float>(c.rms_norm_eps);
    // Each residual add is fused with the norm that follows it (add_rms_norm): the MLP output y of
    // layer l is added at layer l + 1's attention norm, the last one at the final norm.
    const bool stacked = n == 1 && run_stack(be, c, ao, rope, in, cache, x);  // every layer in one go
    for (size_t l = 0; l < layers_.size() && !stacked; ++l) {
      const LlamaLayer& L = layers_[l];
      cache.layer_mask(L.window, ao.window, ao.sink);
      if (l == 0) be.rms_norm(x, L.attn_norm, eps, false, h);
      else be.add_rms_norm(x, y, L.attn_norm, eps, false, h);  // x += previous MLP output
      attention_block(be, c, L.attn, ao, h, in, cache.k[l], cache.v[l], cache.block_size, y);
      be.add_rms_norm(x, y, L.mlp_norm, eps, false, h);  // x += attention output
      if (L.moe) moe_block(be, *L.moe, act_, h, y);
      else mlp_block(be, L.mlp, act_, h, y);
    }
    return output_logits(be, x, in, final_norm_, eps, false, head_, 0.0f, stacked || layers_.empty() ? nullptr : &y);
  }

 private:
  backend::Activation act_;
  Weight embed_, head_;
  Tensor final_norm_;
  std::vector<LlamaLayer> layers_;
  bool has_moe_ = false;

  // The backend's fused decoder over every layer (dense layers without per-head q/k norms); false
  // where the backend has none or it does not cover these layers (nothing done).
  bool run_stack(backend::Backend& be, const ModelConfig& c, const AttentionOptions& ao, const DeviceRope& rope,
                 const StepInputs& in, KvCache& cache, Tensor& x) const {
    backend::FusedDecoder* fused = be.fused_decoder();
    if (!fused || has_moe_ || layers_.empty()) return false;
    std::vector<backend::DecoderLayerRef> refs;
    refs.reserve(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LlamaLayer& L = layers_[l];
      if (!L.attn.q_norm.empty()) return false;
      int window, sink;
      cache.layer_mask(L.window, window, sink);
      refs.push_back({&L.attn_norm, &L.mlp_norm, &L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o, &L.mlp.gate, &L.mlp.up,
                      &L.mlp.down, &cache.k[l], &cache.v[l], window, sink});
    }
    // attn.window is unused: the window is per layer (DecoderLayerRef).
    const backend::DecoderStackArgs a{.layers = refs,
                                      .attn = attn_params(c, ao, cache.block_size, in.max_blocks),
                                      .act = act_,
                                      .eps = static_cast<float>(c.rms_norm_eps),
                                      .inv_freq = rope.inv_freq,
                                      .attn_factor = rope.attn_factor,
                                      .positions = in.positions,
                                      .slots = in.slots,
                                      .block_tables = in.block_tables,
                                      .token_seq = in.token_seq};
    return fused->run(a, x);
  }

  // True when every MoE layer runs n tokens on the device (Backend::moe_on_device); dense models: true.
  bool graph_safe(int64_t n) const override {
    if (!has_moe_) return true;
    for (const LlamaLayer& L : layers_)
      if (L.moe && !moe_block_on_device(*backend_, *L.moe, n)) return false;
    return true;
  }
};

}  // namespace

std::unique_ptr<Model> create_llama(const ModelConfig& c, const io::WeightSet& w, backend::Backend& be) {
  return std::make_unique<Llama>(c, w, be);
}

}  // namespace kiln::model
