// Test helpers shared by the model-level tests: load a model folder on a backend, and run a
// chunk of one sequence whose KV lives in blocks 0, 1, 2, ... of the cache.
#pragma once
#include <memory>
#include <string>
#include <vector>

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

// Runs tokens [begin, end) of one sequence (slot = position; blocks 0..n_blocks-1 in order);
// returns logits of every position when all_logits, else of the last one.
inline Tensor run_chunk(model::Model& m, model::KvCache& kv, const std::vector<int32_t>& tokens, int begin, int end,
                        bool all_logits) {
  model::Batch b;
  b.n_seqs = 1;
  b.max_blocks = kv.n_blocks;
  for (int i = 0; i < kv.n_blocks; ++i) b.block_tables.push_back(i);
  for (int p = begin; p < end; ++p) {
    b.tokens.push_back(tokens[p]);
    b.positions.push_back(p);
    b.token_seq.push_back(0);
    b.slots.push_back(p);
    if (all_logits || p == end - 1) b.logit_rows.push_back(p - begin);
  }
  return m.forward(b, kv);
}

}  // namespace kiln::test
