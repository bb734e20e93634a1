// The mixed-precision recipes, with mlx-lm's layer choice (convert.py's mixed_quant_predicate),
// and the per-model rules of mlx-lm's model classes (models/<type>.py `quant_predicate`).
#include "kiln/quant/recipes.h"

#include <fmt/format.h>

#include <cctype>

#include "kiln/base/error.h"

namespace kiln::quant {

std::vector<std::string> recipe_names() { return {"mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"}; }

std::optional<Recipe> recipe_from_name(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name == "mixed_2_6") return Recipe{name, 2, 6};
  if (name == "mixed_3_4") return Recipe{name, 3, 4};
  if (name == "mixed_3_6") return Recipe{name, 3, 6};
  if (name == "mixed_4_6") return Recipe{name, 4, 6};
  fail("quant", "unknown --quant-predicate \"{}\" (known: {})", name, fmt::join(recipe_names(), ", "));
}

static std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts;
  size_t b = 0;
  for (;;) {
    size_t e = s.find('.', b);
    parts.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return parts;
}

static bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

int recipe_layer_location(const std::vector<std::string>& module_paths) {
  for (const auto& p : module_paths) {
    if (p.find("down_proj") == std::string::npos) continue;
    auto parts = split_dots(p);
    // mlx-lm's loop leaves the index at the last component when none is a number.
    for (size_t i = 0; i < parts.size(); ++i)
      if (all_digits(parts[i])) return static_cast<int>(i);
    return static_cast<int>(parts.size()) - 1;
  }
  fail("quant", "the model has no down_proj layers, which the mixed recipes need to find the layer index");
}

QuantParams recipe_params(const Recipe& r, const std::string& path, int layer_location, int n_layers, int group_size) {
  auto parts = split_dots(path);
  int index = 0;
  if (static_cast<int>(parts.size()) > layer_location) {
    if (!all_digits(parts[layer_location]))
      fail("quant", "recipe {}: module path \"{}\" has no layer number at component {}", r.name, path, layer_location);
    index = std::stoi(parts[layer_location]);
  }
  // Python's // and % on non-negative ints; (index - n/8) may be negative, where % is Python's.
  const int eighth = n_layers / 8;
  const int d = index - eighth;
  const int mod3 = ((d % 3) + 3) % 3;
  const bool use_more_bits = index < eighth || index >= 7 * n_layers / 8 || mod3 == 2;
  const bool is_v = path.find("v_proj") != std::string::npos || path.find("v_a_proj") != std::string::npos ||
                    path.find("v_b_proj") != std::string::npos;
  QuantParams p;
  p.group_size = group_size;
  p.bits = r.low_bits;
  if ((is_v || path.find("down_proj") != std::string::npos) && use_more_bits) p.bits = r.high_bits;
  if (path.find("lm_head") != std::string::npos) p.bits = r.high_bits;
  return p;
}

std::optional<QuantParams> model_quant_rule(const std::string& model_type, const std::string& path) {
  // qwen3_moe.py: `if path.endswith("mlp.gate"): return {"group_size": 64, "bits": 8}`: the router
  // (a small [n_experts, dim] Linear whose errors move every token's expert choice). The dense
  // MLP's gate_proj ("mlp.gate_proj") does not end with "mlp.gate".
  if (model_type == "qwen3_moe" && path.ends_with("mlp.gate")) {
    QuantParams p;
    p.bits = 8;
    p.group_size = 64;
    return p;
  }
  return std::nullopt;
}

}  // namespace kiln::quant
