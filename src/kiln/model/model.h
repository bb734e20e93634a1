// The model interface: a forward pass over one ragged Batch (tokens of many sequences, each
// with its own KV block table) that writes K/V into the paged cache and returns logits for the
// requested rows. Families implement it (one file each) and register by model_type.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/io/safetensors.h"
#include "kiln/model/config.h"

namespace kiln::model {

// One step's work, on the host. The runner fills it; the model uploads it.
struct Batch {
  std::vector<int32_t> tokens;        // [n_tokens] flattened over sequences
  std::vector<int32_t> positions;     // [n_tokens] absolute position within its sequence
  std::vector<int32_t> token_seq;     // [n_tokens] index of its sequence in this batch
  std::vector<int32_t> slots;         // [n_tokens] KV row: block * block_size + offset
  std::vector<int32_t> block_tables;  // [n_seqs * max_blocks] physical block ids (unused: 0)
  int n_seqs = 0;
  int max_blocks = 0;
  std::vector<int32_t> logit_rows;    // [n_out] indices into tokens whose logits are returned
  // The caller only needs each row's argmax (greedy sampling): forward then returns i32 [n_out]
  // token ids instead of f32 logits, computed on the device (the GPU path: no logits download).
  bool greedy_only = false;
  // Non-empty (one per logit row): sample on the device (Backend::sample_rows) with these
  // parameters and logit adjustments; forward then returns the drawn ids i32 [n_out].
  std::vector<backend::SampleParams> sample_params;
  std::vector<backend::LogitAdjust> sample_adjust;
  bool returns_ids() const { return greedy_only || !sample_params.empty(); }
  int n_tokens() const { return static_cast<int>(tokens.size()); }
};

// The paged KV cache storage: per layer K and V [n_blocks, block_size, n_kv_heads * head_dim].
struct KvCache {
  int n_blocks = 0, block_size = 0;
  std::vector<Tensor> k, v;  // [n_layers]
  static KvCache allocate(backend::Backend& be, const ModelConfig& c, int n_blocks, int block_size);
  size_t bytes() const;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  backend::Backend& backend() const { return *backend_; }
  // Runs the batch; returns logits f32 [batch.logit_rows.size(), vocab_size] on the host (every
  // backend), or with batch.greedy_only the argmax ids i32 [batch.logit_rows.size()].
  virtual Tensor forward(const Batch& batch, KvCache& cache) = 0;

 protected:
  Model(ModelConfig c, backend::Backend& be) : config_(std::move(c)), backend_(&be) {}
  ModelConfig config_;
  backend::Backend* backend_;
};

using ModelFactory = std::function<std::unique_ptr<Model>(const ModelConfig&, const io::WeightSet&, backend::Backend&)>;

// Builds the family registered for config.model_type; unknown types fail with the list of known ones.
std::unique_ptr<Model> create_model(const ModelConfig& config, const io::WeightSet& weights, backend::Backend& be);
std::vector<std::string> supported_model_types();

}  // namespace kiln::model
