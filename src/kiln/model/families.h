// Factories of the model families (one .cpp each), listed for the registry.
#pragma once
#include "kiln/model/model.h"

namespace kiln::model {

// llama, mistral, qwen2 (qkv bias), qwen3 (q/k norms), phi3 (fused qkv / gate_up).
std::unique_ptr<Model> create_llama(const ModelConfig& c, const io::WeightSet& w, backend::Backend& be);

}  // namespace kiln::model
