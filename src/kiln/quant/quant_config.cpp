// Parsing and writing config.json's `quantization` section (see quant_config.h for the format).
#include "kiln/quant/quant_config.h"

#include "kiln/quant/affine.h"

namespace kiln::quant {

static QuantParams parse_params(const Json& j, const QuantParams& fallback, const std::string& where) {
  QuantParams p = fallback;
  if (auto v = json_get<int>(j, "bits", where)) p.bits = *v;
  if (auto v = json_get<int>(j, "group_size", where)) p.group_size = *v;
  if (auto v = json_get<std::string>(j, "mode", where)) p.mode = *v;
  if (p.mode != "affine")
    fail("quant", "{}: quantization mode \"{}\" is not supported (kiln reads MLX's affine mode only)", where, p.mode);
  check_params(p.bits, p.group_size, where);
  return p;
}

std::optional<QuantConfig> QuantConfig::from_model_config(const Json& config, const std::string& where) {
  const Json* sec = nullptr;
  std::string key;
  for (const char* k : {"quantization", "quantization_config"}) {
    auto it = config.find(k);
    if (it != config.end() && it->is_object()) {
      sec = &*it;
      key = k;
      break;
    }
  }
  if (!sec) return std::nullopt;
  const std::string at = where + " \"" + key + "\"";
  // quantization_config from other tools (awq, gptq, bitsandbytes, ...) carries quant_method.
  if (auto m = json_get<std::string>(*sec, "quant_method", at))
    fail("quant", "{}: quant_method \"{}\" is not supported; kiln reads MLX affine folders (mlx-lm's "
         "\"quantization\" section). Convert the original float model with `kiln convert -q`.", at, *m);
  QuantConfig qc(parse_params(*sec, QuantParams{}, at));
  for (auto it = sec->begin(); it != sec->end(); ++it) {
    const std::string& k = it.key();
    if (k == "bits" || k == "group_size" || k == "mode") continue;
    if (it->is_boolean()) {
      if (!it->get<bool>()) qc.skip_module(k);
      else qc.set_module(k, qc.defaults_);
    } else if (it->is_object()) {
      qc.set_module(k, parse_params(*it, qc.defaults_, at + " \"" + k + "\""));
    }
    // other scalar keys (e.g. "quant_method" absent, future flags) are ignored as mlx-lm does
  }
  return qc;
}

std::optional<QuantParams> QuantConfig::for_module(const std::string& path, bool has_scales) const {
  auto it = modules_.find(path);
  if (it != modules_.end()) return it->second;
  if (has_scales) return defaults_;
  return std::nullopt;
}

Json QuantConfig::to_json() const {
  Json j = defaults_.to_json();
  for (const auto& [path, p] : modules_) j[path] = p ? p->to_json() : Json(false);
  return j;
}

}  // namespace kiln::quant
