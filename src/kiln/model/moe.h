// Mixture-of-experts MLP (qwen3_moe, mixtral): a router picks top-k experts per token from a
// softmax over all experts (renormalized over the k when norm_topk_prob); each expert runs once
// over all of its tokens (gathered rows -> one matmul chain), and outputs are scattered back
// weighted. Routing is decided on the host from the router logits.
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

// Loads PREFIX.gate (qwen3_moe: PREFIX = "...mlp.") or PREFIX.gate with experts.{e}.w1/w2/w3 (mixtral:
// PREFIX = "...block_sparse_moe.").
MoeWeights load_moe(const io::WeightSet& ws, const std::string& prefix, const ModelConfig& c);

// out [n, dim] = sum over the chosen experts e of weight_e * expert_e(x); x [n, dim] normed input.
void moe_block(backend::Backend& be, const MoeWeights& w, backend::Activation act, const Tensor& x, Tensor& out);

}  // namespace kiln::model
