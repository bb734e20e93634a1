// Building blocks shared by the families: weight lookup, the output head, the
// attention block over the paged cache (projections, optional q/k norms, RoPE, KV write,
// attention, output projection) and the gated MLP. A family composes these; it does not copy them.
#pragma once
#include <string>

#include "kiln/model/model.h"
#include "kiln/model/rope.h"

namespace kiln::model {

// A linear layer at `prefix` (prefix.weight, optional prefix.bias). A quantized one (MLX layout:
// u32 prefix.weight plus prefix.scales/.biases) takes its bits/group size from config.json's
// quantization section (per-module entry, else the defaults), as mlx-lm loads it.
backend::Weight load_linear(const io::WeightSet& w, const std::string& prefix, const ModelConfig& c);
// The token embedding at model.embed_tokens (float or quantized), checked against hidden_size; a
// tied head uses it as its linear weight (a quantized table then serves as a quantized head).
backend::Weight load_embedding(const io::WeightSet& w, const ModelConfig& c);
// A norm or other plain vector weight; `required` false returns an empty tensor when absent.
Tensor load_vector(const io::WeightSet& w, const std::string& name, bool required = true);

// The output head shared by the families: only the rows that need logits (in.logit_rows) of the
// residual stream x [n_tokens, dim] go through the final norm ((1 + w) when one_plus_w) and the
// head into f32 logits [n_out, vocab] on the device, softcapped when softcap > 0.
// `pending` (optional, [n_tokens, dim]): the last block's output, not yet added to x; the add is
// done here, fused with the final norm (add_rms_norm over every row, then the gather).
Tensor output_logits(backend::Backend& be, Tensor& x, const StepInputs& in, const Tensor& final_norm, float eps,
                     bool one_plus_w, const backend::Weight& head, float softcap, const Tensor* pending = nullptr);

struct AttentionWeights {
  backend::Weight q, k, v, o;
  Tensor q_norm, k_norm;  // [head_dim] each, empty when the family has none
};

struct AttentionOptions {
  float scale = 1.0f;
  float softcap = 0.0f;
  int window = 0;
  int sink = 0;                // AttnParams::sink (KvCache::layer_mask)
  bool norm_one_plus = false;  // q/k norms use (1 + w) (gemma3)
  double norm_eps = 1e-6;
  Tensor inv_freq;             // f32 [rotary_dim / 2] on the device
  float rope_attn_factor = 1.0f;
};

// The attention parameters of the model and options o (window included) over the step's block tables.
backend::AttnParams attn_params(const ModelConfig& c, const AttentionOptions& o, int block_size, int max_blocks);
// out [n_tokens, dim] = o_proj(attention(rope(q), rope(k), v)) for layer `layer`; x is the normed input.
// q/k/v come from one matmul_multi; rope and the KV write are one rope_kv_write (after the q/k norms).
void attention_block(backend::Backend& be, const ModelConfig& c, const AttentionWeights& w, const AttentionOptions& o,
                     const Tensor& x, const StepInputs& in, const backend::KvTensor& k_cache,
                     const backend::KvTensor& v_cache, int block_size, Tensor& out);

// q/k/v/o at PREFIX (PREFIX.q_proj ... or phi3's fused PREFIX.qkv_proj, split into row views),
// plus optional q_norm/k_norm; row counts checked against the config.
AttentionWeights load_attention(const io::WeightSet& ws, const std::string& prefix, const ModelConfig& c);

struct MlpWeights {
  backend::Weight gate, up, down;
};
// gate/up/down at PREFIX (gate_proj/up_proj/down_proj, or phi3's fused gate_up_proj), or with
// Mixtral's names (w1 = gate, w3 = up, w2 = down).
MlpWeights load_mlp(const io::WeightSet& ws, const std::string& prefix, const ModelConfig& c);
// out [n_tokens, dim] = down(act(gate(x)) * up(x)); gate and up from one matmul_multi.
void mlp_block(backend::Backend& be, const MlpWeights& w, backend::Activation act, const Tensor& x, Tensor& out);

// Rounds v to the precision of the checkpoint dtype ("bfloat16"/"float16"), as transformers does
// for constants it keeps as tensors of the model dtype (embedding scales, inv_freq buffers).
float round_to_model_dtype(float v, const ModelConfig& c);

backend::Activation activation_from_name(const std::string& name, const std::string& where);

}  // namespace kiln::model
