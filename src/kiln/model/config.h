// ModelConfig: the parts of a Hugging Face config.json (+ generation_config.json) the forward
// passes need, read from either transformers 4 (rope_theta/rope_scaling) or 5 (rope_parameters).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/base/json.h"
#include "kiln/quant/quant_config.h"

namespace kiln::model {

// One RoPE configuration (a model may have one per layer type, as gemma3 does).
struct RopeConfig {
  std::string type = "default";  // default | linear | dynamic | llama3 | yarn
  double theta = 10000.0;
  double factor = 1.0;
  double partial_rotary_factor = 1.0;
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;  // 0: use max_position_embeddings
  // yarn
  double beta_fast = 32.0, beta_slow = 1.0;
  std::optional<double> attention_factor, mscale, mscale_all_dim;
};

struct GenerationDefaults {
  std::vector<int32_t> eos_ids;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<bool> do_sample;
};

struct ModelConfig {
  std::string dir;  // where it was read from (for messages)
  std::string model_type;
  int dim = 0;                 // hidden_size
  int n_layers = 0;            // num_hidden_layers
  int n_heads = 0;             // num_attention_heads
  int n_kv_heads = 0;          // num_key_value_heads (defaults to n_heads)
  int head_dim = 0;            // head_dim, or dim / n_heads
  int ffn_dim = 0;             // intermediate_size
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v and o_proj biases (llama's attention_bias; qwen2 has q/k/v biases always)
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  RopeConfig rope;                                  // the default (or only) RoPE
  std::map<std::string, RopeConfig> rope_by_layer_type;  // gemma3: sliding_attention / full_attention
  int sliding_window = 0;                           // 0: none
  std::vector<std::string> layer_types;             // per layer: full_attention | sliding_attention
  std::string dtype = "float32";                    // torch_dtype / dtype
  std::optional<int32_t> bos_id;
  GenerationDefaults generation;                    // generation_config.json (eos ids merged with config's)
  Json raw;                                         // the whole config.json, for family-specific keys
  // config.json's MLX `quantization` section (per-module bits/group size); nullopt for a float model.
  std::optional<quant::QuantConfig> quant;
  // Not from config.json: the run's KV cache quantization (--kv-bits, --kv-group-size, resolved for
  // head_dim by backend::resolve_kv_quant); bits 0 = float K/V. KvCache::allocate and the KV sizing read it.
  backend::KvQuant kv_quant;

  // Reads DIR/config.json (required) and DIR/generation_config.json (optional).
  static ModelConfig load_dir(const std::string& dir);
  // From file contents (the embedded model); generation_json may be "".
  static ModelConfig from_json(const std::string& config_json, const std::string& generation_json, const std::string& where);

  const RopeConfig& rope_for_layer(int layer) const;
  bool layer_is_sliding(int layer) const;
};

}  // namespace kiln::model
