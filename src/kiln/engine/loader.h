// Loading a model for running: resolve the argument to a folder (or the embedded default),
// read config, weights, tokenizer, pick the backend and build the family's forward.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "kiln/backend/backend.h"
#include "kiln/io/safetensors.h"
#include "kiln/model/model.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::engine {

struct LoadedModel {
  std::string path;  // the folder, or "<embedded stories260K>"
  model::ModelConfig config;
  io::WeightSet weights;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<model::Model> model;
  // EOS ids: generation_config/config eos ids, else the tokenizer's eos token.
  std::vector<int32_t> eos_ids() const;
  // What cached K/V are valid for (kvstore/identity.h), computed at load.
  uint64_t fingerprint = 0, tokenizer_fingerprint = 0;
  // Both in one: the prefix cache's key (EngineConfig::model_key), which the SSD tier's folders
  // and prompt cache files are checked against.
  uint64_t cache_key() const;
};

struct LoadOptions {
  std::string device = "cpu";
};

// `arg` is a local folder or a Hugging Face repo id in the local cache.
std::unique_ptr<LoadedModel> load_model(const std::string& arg, const LoadOptions& opt = {});
// A model whose files are in memory (file name -> bytes that live for the program).
std::unique_ptr<LoadedModel> load_model_from_memory(const std::map<std::string, std::string_view>& files,
                                                    const std::string& name, const LoadOptions& opt = {});

}  // namespace kiln::engine
