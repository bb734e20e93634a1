// Factories of the model families (one .cpp each), listed for the registry.
#pragma once
#include "kiln/model/model.h"

namespace kiln::model {

// gemma, gemma2 (pre/post norms, softcaps, alternating sliding layers), gemma3_text (q/k norms,
// local/global RoPE).
std::unique_ptr<Model> create_gemma(const ModelConfig& c, const io::WeightSet& w, backend::Backend& be);
// llama, mistral, qwen2 (qkv bias), qwen3 (q/k norms), phi3 (fused qkv / gate_up), qwen3_moe and mixtral (MoE).
std::unique_ptr<Model> create_llama(const ModelConfig& c, const io::WeightSet& w, backend::Backend& be);

}  // namespace kiln::model
