// Test helpers shared by the model-level tests: load a model folder on a backend, and run a
// chunk of one sequence whose KV lives in blocks 0, 1, 2, ... of the cache (through the runner).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kiln/engine/model_runner.h"
#include "kiln/model/model.h"

namespace kiln::test {

struct LoadedModel {
  model::ModelConfig cfg;
  io::WeightSet weights;
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<model::Model> m;
};

// be: the backend to run on (default: the CPU reference).
inline std::unique_ptr<LoadedModel> load_model_dir(const std::string& dir, std::unique_ptr<backend::Backend> be = nullptr) {
  auto l = std::make_unique<LoadedModel>();
  l->cfg = model::ModelConfig::load_dir(dir);
  l->weights = io::WeightSet::open_dir(dir);
  l->be = be ? std::move(be) : backend::make_cpu_backend();
  l->m = model::create_model(l->cfg, l->weights, *l->be);
  return l;
}

// Runs tokens [begin, end) of one sequence through the engine's ModelRunner (KV in blocks 0, 1, 2,
// ... of the cache, so slot = position); returns host logits f32 of every position when all_logits,
// else of the last one.
inline Tensor run_chunk(model::Model& m, model::KvCache& kv, const std::vector<int32_t>& tokens, int begin, int end,
                        bool all_logits) {
  std::vector<int32_t> blocks(kv.n_blocks);
  for (int i = 0; i < kv.n_blocks; ++i) blocks[i] = i;
  engine::SeqChunk c;
  c.tokens = tokens;
  c.start = begin;
  c.n_tokens = end - begin;
  c.blocks = blocks;
  c.n_logits = all_logits ? c.n_tokens : 1;
  return engine::ModelRunner(m, kv).logits({&c, 1});
}

}  // namespace kiln::test
