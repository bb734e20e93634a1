// Mixture-of-experts MLP (qwen3_moe, mixtral): a router picks top-k experts per token from a
// softmax over all experts (renormalized over the k when norm_topk_prob); each expert runs once
// over all of its tokens (gathered rows -> one matmul chain), and outputs are scattered back
// weighted. Routing and the expert MLPs are the Backend ops moe_route / moe_experts: host routing
// on the CPU; on CUDA decode-sized batches stay on the device (no host sync, graph-capturable).
#pragma once
#include <vector>

#include "kiln/model/layers.h"

namespace kiln::model {

struct MoeWeights {
  backend::Weight router;            // [n_experts, dim]
  std::vector<MlpWeights> experts;   // [n_experts]
  int top_k = 2;
  bool norm_topk_prob = true;
};

// Loads the router PREFIX.gate and the experts (qwen3_moe: PREFIX = "...mlp.", mixtral:
// PREFIX = "...block_sparse_moe.") in either layout:
//  - Hugging Face, one module per expert: PREFIX.experts.{e}.{gate,up,down}_proj (mixtral: w1/w3/w2);
//  - mlx-lm's stacked SwitchGLU: PREFIX.switch_mlp.{gate,up,down}_proj.weight [n_experts, out, in],
//    or quantized u32 [n_experts, out, in * bits / 32] + .scales/.biases [n_experts, out, in / group_size]
//    (bits/group size per module path from config.json, as load_linear), split into per-expert
//    zero-copy views.
MoeWeights load_moe(const io::WeightSet& ws, const std::string& prefix, const ModelConfig& c);

// Expert e of a stacked tensor t [n_experts, rows, cols] as a 2-D view [rows, cols] (no copy).
Tensor expert_view(const Tensor& t, int64_t e);

// The experts as the Backend's per-expert references (pointing into w; valid while w lives).
std::vector<backend::ExpertWeights> expert_refs(const MoeWeights& w);

// out [n, dim] = sum over the chosen experts e of weight_e * expert_e(x); x [n, dim] normed input.
void moe_block(backend::Backend& be, const MoeWeights& w, backend::Activation act, const Tensor& x, Tensor& out);

// Whether moe_block over n_tokens runs without a host round trip on `be` (then a step using it
// may be captured as a graph): Backend::moe_on_device for this layer's experts.
bool moe_block_on_device(const backend::Backend& be, const MoeWeights& w, int64_t n_tokens);

}  // namespace kiln::model
