// model_type -> family. Adding an architecture is one file in model/ plus one line here.
#include <map>

#include "kiln/model/families.h"
#include "kiln/model/model.h"

namespace kiln::model {

static const std::map<std::string, ModelFactory>& registry() {
  static const std::map<std::string, ModelFactory> r = {
      {"llama", create_llama},
      {"mistral", create_llama},
      {"qwen2", create_llama},
      {"qwen3", create_llama},
      {"phi3", create_llama},
      {"qwen3_moe", create_llama},
      {"mixtral", create_llama},
      {"gemma", create_gemma},
      {"gemma2", create_gemma},
      {"gemma3_text", create_gemma},
  };
  return r;
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> names;
  for (auto& [k, v] : registry()) names.push_back(k);
  return names;
}

std::unique_ptr<Model> create_model(const ModelConfig& config, const io::WeightSet& weights, backend::Backend& be) {
  auto it = registry().find(config.model_type);
  if (it == registry().end()) {
    std::string known;
    for (auto& n : supported_model_types()) known += (known.empty() ? "" : ", ") + n;
    fail("model", "{}: unknown model_type \"{}\" (supported: {})", config.dir.empty() ? "config.json" : config.dir + "/config.json",
         config.model_type, known);
  }
  return it->second(config, weights, be);
}

}  // namespace kiln::model
