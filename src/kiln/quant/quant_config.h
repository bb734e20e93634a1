// config.json's `quantization` section as mlx-lm reads and writes it: default group_size/bits/mode,
// plus per-module entries keyed by module path ("model.layers.0.mlp.down_proj"): a dict with its
// own group_size/bits, or `false` for a module left in float. `quantization_config` (the HF key
// mlx-lm mirrors it to) is read when `quantization` is absent, for affine configs only.
#pragma once
#include <map>
#include <optional>
#include <string>

#include "kiln/base/json.h"

namespace kiln::quant {

struct QuantParams {
  int bits = 4, group_size = 64;
  std::string mode = "affine";
  bool operator==(const QuantParams& o) const { return bits == o.bits && group_size == o.group_size && mode == o.mode; }
  Json to_json() const { return {{"group_size", group_size}, {"bits", bits}, {"mode", mode}}; }
};

class QuantConfig {
 public:
  // From a whole config.json; nullopt when it has no (affine) quantization section. Throws [quant]
  // naming `where` for a malformed section or a mode other than affine.
  static std::optional<QuantConfig> from_model_config(const Json& config, const std::string& where);

  const QuantParams& defaults() const { return defaults_; }
  // mlx-lm's load rule for the module at `path` (no ".weight"): its own entry when present (false
  // -> nullopt), else the defaults when the folder has `path.scales`, else nullopt (float).
  std::optional<QuantParams> for_module(const std::string& path, bool has_scales) const;

  // Building a section (convert): defaults plus per-module entries, written in insertion order.
  explicit QuantConfig(QuantParams defaults) : defaults_(std::move(defaults)) {}
  void set_module(const std::string& path, const QuantParams& p) { modules_[path] = p; }
  void skip_module(const std::string& path) { modules_[path] = std::nullopt; }
  // {"group_size", "bits", "mode", <path>: {...} | false, ...}
  Json to_json() const;

 private:
  QuantParams defaults_;
  std::map<std::string, std::optional<QuantParams>> modules_;
};

}  // namespace kiln::quant
