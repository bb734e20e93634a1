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
  // The KV cache's quantization (--kv-bits 8|4, 0 = float; --kv-group-size, mlx-lm's default 64).
  // A group wider than the model's head_dim is narrowed to head_dim (with a note); it must divide it.
  int kv_bits = 0, kv_group_size = 64;
};

// The KV cache of config c under opt (bits, the group resolved for c.head_dim); throws [engine] on
// bits other than 0/4/8, a group size other than 32/64/128, or one that does not divide head_dim.
backend::KvQuant kv_quant_for(const model::ModelConfig& c, const LoadOptions& opt);
// The start-up line of a loaded model's KV cache: "KV cache: 8-bit, groups of 64: 73728 bytes per
// token (53.1% of the bf16 cache's 131072)" (all layers, K and V), noting a group narrowed to head_dim.
std::string describe_kv_cache(const LoadedModel& m, int requested_group_size);

// `arg` is a local folder or a Hugging Face repo id in the local cache.
std::unique_ptr<LoadedModel> load_model(const std::string& arg, const LoadOptions& opt = {});
// A model whose files are in memory (file name -> bytes that live for the program).
std::unique_ptr<LoadedModel> load_model_from_memory(const std::map<std::string, std::string_view>& files,
                                                    const std::string& name, const LoadOptions& opt = {});

}  // namespace kiln::engine
