// mlx-lm's mixed-precision recipes (--quant-predicate mixed_2_6 | mixed_3_4 | mixed_3_6 | mixed_4_6):
// low bits everywhere, high bits for v_proj and down_proj of the first 1/8 and last 1/8 of the
// layers and every third layer between, and for lm_head (as llama.cpp's Q4_K_M picks them).
// Also the model classes' own `quant_predicate` rules (used when no recipe is given).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "kiln/quant/quant_config.h"

namespace kiln::quant {

struct Recipe {
  std::string name;
  int low_bits = 4, high_bits = 6;
};

// The recipe by name; nullopt for "" ; throws [quant] for an unknown name (listing the known ones).
std::optional<Recipe> recipe_from_name(const std::string& name);
std::vector<std::string> recipe_names();

// Per-module parameters for `path` ("model.layers.3.mlp.down_proj"): `layer_location` is the index of
// the layer-number component in module paths (found from the first down_proj path, as mlx-lm does)
// and n_layers the number of decoder layers.
QuantParams recipe_params(const Recipe& r, const std::string& path, int layer_location, int n_layers, int group_size);
// mlx-lm's layer_location: the first all-digit component of the first path containing "down_proj";
// throws [quant] when no path contains down_proj.
int recipe_layer_location(const std::vector<std::string>& module_paths);

// The rule of mlx-lm's model class for `model_type` (its `quant_predicate` property), which
// quantize_model applies when no recipe is given: nullopt = the defaults (mlx-lm's True), else the
// module's own parameters (recorded in config.json). qwen3_moe keeps the router `...mlp.gate` at
// 8 bits, group size 64 (whatever the defaults); the other kiln families (mixtral included) have
// no rule: their routers are quantized with the defaults like any Linear.
std::optional<QuantParams> model_quant_rule(const std::string& model_type, const std::string& path);

}  // namespace kiln::quant
