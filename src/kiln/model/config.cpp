// config.json -> ModelConfig. Missing required keys are reported with the file and key name.
#include "kiln/model/config.h"

#include <filesystem>

#include "kiln/base/mapped_file.h"

namespace kiln::model {

namespace {

RopeConfig parse_rope(const Json& j, double default_theta, const std::string& where) {
  RopeConfig r;
  r.theta = default_theta;
  if (!j.is_object()) return r;
  if (auto v = json_get<double>(j, "rope_theta", where)) r.theta = *v;
  if (auto v = json_get<std::string>(j, "rope_type", where)) r.type = *v;
  else if (auto t = json_get<std::string>(j, "type", where)) r.type = *t;  // transformers 4 spelling
  if (r.type == "su") r.type = "longrope";
  if (auto v = json_get<double>(j, "factor", where)) r.factor = *v;
  if (auto v = json_get<double>(j, "partial_rotary_factor", where)) r.partial_rotary_factor = *v;
  if (auto v = json_get<double>(j, "low_freq_factor", where)) r.low_freq_factor = *v;
  if (auto v = json_get<double>(j, "high_freq_factor", where)) r.high_freq_factor = *v;
  if (auto v = json_get<int64_t>(j, "original_max_position_embeddings", where)) r.original_max_position_embeddings = *v;
  if (auto v = json_get<double>(j, "beta_fast", where)) r.beta_fast = *v;
  if (auto v = json_get<double>(j, "beta_slow", where)) r.beta_slow = *v;
  r.attention_factor = json_get<double>(j, "attention_factor", where);
  r.mscale = json_get<double>(j, "mscale", where);
  r.mscale_all_dim = json_get<double>(j, "mscale_all_dim", where);
  static const char* known[] = {"default", "linear", "dynamic", "llama3", "yarn"};
  bool ok = false;
  for (auto k : known) ok |= r.type == k;
  if (!ok) fail("config", "{}: unsupported RoPE type \"{}\" (supported: default, linear, dynamic, llama3, yarn)", where, r.type);
  return r;
}

std::vector<int32_t> parse_ids(const Json& j) {
  std::vector<int32_t> ids;
  if (j.is_number_integer()) ids.push_back(j.get<int32_t>());
  else if (j.is_array())
    for (auto& x : j)
      if (x.is_number_integer()) ids.push_back(x.get<int32_t>());
  return ids;
}

}  // namespace

ModelConfig ModelConfig::from_json(const std::string& config_json, const std::string& generation_json, const std::string& where) {
  ModelConfig c;
  Json j = parse_json(config_json, where, "config");
  if (!j.is_object()) fail("config", "{}: expected a JSON object", where);
  // Multimodal wrappers keep the language model's keys under text_config.
  if (j.contains("text_config") && j["text_config"].is_object() && !j.contains("num_hidden_layers")) {
    Json t = j["text_config"];
    if (!t.contains("model_type") && j.contains("model_type")) t["model_type"] = j["model_type"];
    for (const char* k : {"quantization", "quantization_config"})  // mlx-lm keeps these at the top level
      if (j.contains(k) && !t.contains(k)) t[k] = j[k];
    j = t;
  }
  c.raw = j;
  c.quant = quant::QuantConfig::from_model_config(j, where);
  c.model_type = json_require<std::string>(j, "model_type", where);
  c.dim = json_require<int>(j, "hidden_size", where);
  c.n_layers = json_require<int>(j, "num_hidden_layers", where);
  c.n_heads = json_require<int>(j, "num_attention_heads", where);
  c.n_kv_heads = json_get<int>(j, "num_key_value_heads", where).value_or(c.n_heads);
  c.head_dim = json_get<int>(j, "head_dim", where).value_or(0);
  c.ffn_dim = json_get<int>(j, "intermediate_size", where).value_or(0);
  c.vocab_size = json_require<int>(j, "vocab_size", where);
  c.max_position_embeddings = json_get<int>(j, "max_position_embeddings", where).value_or(4096);
  c.rms_norm_eps = json_get<double>(j, "rms_norm_eps", where).value_or(1e-6);
  c.tie_word_embeddings = json_get<bool>(j, "tie_word_embeddings", where).value_or(false);
  c.attention_bias = json_get<bool>(j, "attention_bias", where).value_or(false);
  c.mlp_bias = json_get<bool>(j, "mlp_bias", where).value_or(false);
  if (auto a = json_get<std::string>(j, "hidden_activation", where)) c.hidden_act = *a;
  else if (auto b = json_get<std::string>(j, "hidden_act", where)) c.hidden_act = *b;
  c.sliding_window = json_get<int>(j, "sliding_window", where).value_or(0);
  if (auto use = json_get<bool>(j, "use_sliding_window", where); use && !*use) c.sliding_window = 0;
  if (auto lt = json_get<std::vector<std::string>>(j, "layer_types", where)) c.layer_types = *lt;
  if (auto d = json_get<std::string>(j, "dtype", where)) c.dtype = *d;
  else if (auto t = json_get<std::string>(j, "torch_dtype", where)) c.dtype = *t;

  if (c.dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.vocab_size <= 0)
    fail("config", "{}: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads and vocab_size must be positive", where);
  if (c.n_heads % c.n_kv_heads != 0)
    fail("config", "{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", where, c.n_heads, c.n_kv_heads);
  if (c.head_dim <= 0) {
    if (c.dim % c.n_heads != 0) fail("config", "{}: hidden_size {} is not divisible by num_attention_heads {}", where, c.dim, c.n_heads);
    c.head_dim = c.dim / c.n_heads;
  }
  if (!c.layer_types.empty() && static_cast<int>(c.layer_types.size()) != c.n_layers)
    fail("config", "{}: layer_types has {} entries for {} layers", where, c.layer_types.size(), c.n_layers);

  // RoPE: transformers 5 keeps everything in rope_parameters (possibly one dict per layer type);
  // transformers 4 has rope_theta plus an optional rope_scaling dict.
  double theta = json_get<double>(j, "rope_theta", where).value_or(10000.0);
  Json top_partial = j.contains("partial_rotary_factor") ? j["partial_rotary_factor"] : Json();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const Json& rp = j["rope_parameters"];
    bool per_type = !rp.empty();
    for (auto& [k, v] : rp.items()) per_type &= v.is_object();
    if (per_type) {
      for (auto& [k, v] : rp.items()) c.rope_by_layer_type[k] = parse_rope(v, theta, where);
      c.rope = c.rope_by_layer_type.count("full_attention") ? c.rope_by_layer_type["full_attention"]
                                                             : c.rope_by_layer_type.begin()->second;
    } else {
      c.rope = parse_rope(rp, theta, where);
    }
  } else {
    c.rope = j.contains("rope_scaling") && j["rope_scaling"].is_object() ? parse_rope(j["rope_scaling"], theta, where)
                                                                        : parse_rope(Json::object(), theta, where);
  }
  // transformers 4 Gemma 3: rope_theta for global layers, rope_local_base_freq for sliding ones.
  if (auto local = json_get<double>(j, "rope_local_base_freq", where); local && c.rope_by_layer_type.empty()) {
    c.rope_by_layer_type["full_attention"] = c.rope;
    RopeConfig l;
    l.theta = *local;
    c.rope_by_layer_type["sliding_attention"] = l;
  }
  // Older configs give the sliding pattern instead of layer_types: gemma2 alternates (even
  // layers slide); gemma3 slides except every sliding_window_pattern-th layer.
  if (c.layer_types.empty() && c.sliding_window > 0) {
    auto pattern = json_get<int>(j, "sliding_window_pattern", where);
    if (!pattern) pattern = json_get<int>(j, "_sliding_window_pattern", where);
    if (c.model_type == "gemma2") pattern = 2;
    if (pattern && *pattern > 0)
      for (int i = 0; i < c.n_layers; ++i)
        c.layer_types.push_back((i + 1) % *pattern == 0 ? "full_attention" : "sliding_attention");
  }
  if (top_partial.is_number()) {
    c.rope.partial_rotary_factor = top_partial.get<double>();
    for (auto& [k, r] : c.rope_by_layer_type) r.partial_rotary_factor = top_partial.get<double>();
  }

  c.bos_id = json_get<int32_t>(j, "bos_token_id", where);
  if (j.contains("eos_token_id")) c.generation.eos_ids = parse_ids(j["eos_token_id"]);
  if (!generation_json.empty()) {
    std::string gwhere = where + " (generation_config.json)";
    Json g = parse_json(generation_json, gwhere, "config");
    if (g.is_object()) {
      if (g.contains("eos_token_id")) {
        for (int32_t id : parse_ids(g["eos_token_id"]))
          if (std::find(c.generation.eos_ids.begin(), c.generation.eos_ids.end(), id) == c.generation.eos_ids.end())
            c.generation.eos_ids.push_back(id);
      }
      if (!c.bos_id) c.bos_id = json_get<int32_t>(g, "bos_token_id", gwhere);
      c.generation.temperature = json_get<double>(g, "temperature", gwhere);
      c.generation.top_p = json_get<double>(g, "top_p", gwhere);
      c.generation.min_p = json_get<double>(g, "min_p", gwhere);
      c.generation.top_k = json_get<int>(g, "top_k", gwhere);
      c.generation.repetition_penalty = json_get<double>(g, "repetition_penalty", gwhere);
      c.generation.do_sample = json_get<bool>(g, "do_sample", gwhere);
    }
  }
  return c;
}

ModelConfig ModelConfig::load_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path cfg = fs::path(dir) / "config.json";
  if (!fs::exists(cfg)) fail("config", "{}: no config.json in this folder (is it a Hugging Face model folder?)", dir);
  fs::path gen = fs::path(dir) / "generation_config.json";
  std::string gen_text = fs::exists(gen) ? read_file(gen.string(), "config") : "";
  ModelConfig c = from_json(read_file(cfg.string(), "config"), gen_text, cfg.string());
  c.dir = dir;
  return c;
}

const RopeConfig& ModelConfig::rope_for_layer(int layer) const {
  if (!rope_by_layer_type.empty() && layer < static_cast<int>(layer_types.size())) {
    auto it = rope_by_layer_type.find(layer_types[layer]);
    if (it != rope_by_layer_type.end()) return it->second;
  }
  return rope;
}

bool ModelConfig::layer_is_sliding(int layer) const {
  if (sliding_window <= 0) return false;
  if (layer_types.empty()) return true;  // mistral-style: every layer slides
  return layer_types[layer] == "sliding_attention";
}

}  // namespace kiln::model
