// MoE expert layouts for `kiln convert`: Hugging Face checkpoints keep one module per expert
// (BLOCK.experts.{e}.gate_proj / mixtral's BLOCK.experts.{e}.w1), mlx-lm keeps each projection of
// all experts in one stacked SwitchLinear, BLOCK.switch_mlp.{gate,up,down}_proj with tensors
// [n_experts, out, ...]. This finds the per-expert groups and names their stacked modules, as
// mlx-lm's `sanitize` of qwen3_moe / mixtral does (mixtral: w1 -> gate_proj, w2 -> down_proj, w3 -> up_proj).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/tensor/tensor.h"

namespace kiln::quant {

// One per-expert tensor name, BLOCK.experts.E.PROJ.SUFFIX, split ("model.layers.0.mlp.",
// 3, "gate_proj", "weight"). Only the SwitchGLU projections qualify (gate_proj/up_proj/down_proj,
// w1/w2/w3) with suffix weight, scales, biases or bias.
struct ExpertTensorName {
  std::string block, proj, suffix;
  int expert = 0;
};
std::optional<ExpertTensorName> parse_expert_tensor(const std::string& name);

// mlx-lm's name for a projection: w1 -> gate_proj, w2 -> down_proj, w3 -> up_proj, others unchanged.
std::string switch_proj_name(const std::string& proj);

// One stacked module to write: `stacked` = BLOCK.switch_mlp.PROJ (no suffix), from the source
// modules `experts[e]` = BLOCK.experts.e.PROJ (no suffix), e = 0 .. n_experts - 1.
struct ExpertGroup {
  std::string stacked;
  std::vector<std::string> experts;
};

// The groups of a folder's tensor names (sorted or not), keyed by their stacked module path.
// Throws [convert] when a group misses an expert (indices must be 0 .. n - 1), or when a block has
// both per-expert and stacked tensors.
std::map<std::string, ExpertGroup> find_expert_groups(const std::vector<std::string>& names);

// t[0], ..., t[n-1] (same dtype and shape S) -> a new host tensor [n, S...].
Tensor stack_tensors(const std::vector<Tensor>& t, const std::string& what);

// A quantization section copied from a per-expert folder (a re-layout without -q/-d): entries keyed
// by per-expert module paths become one entry for their stacked module (they must agree).
void restack_quant_entries(Json& section, const std::map<std::string, ExpertGroup>& groups);

// config.json keys mlx-lm's ModelArgs need that a transformers 5 config of these families lacks:
// qwen3_moe's `num_experts` (transformers 5 writes `num_local_experts`) and `rope_theta` (now under
// `rope_parameters`, default rope type only). Existing keys are never changed.
void add_mlx_lm_moe_keys(Json& config);

}  // namespace kiln::quant
