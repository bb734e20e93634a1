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

// One step's work, on the host. The runner (engine/model_runner.h) fills it and uploads it.
struct Batch {
  std::vector<int32_t> tokens;        // [n_tokens] flattened over sequences
  std::vector<int32_t> positions;     // [n_tokens] absolute position within its sequence
  std::vector<int32_t> token_seq;     // [n_tokens] index of its sequence in this batch
  std::vector<int32_t> slots;         // [n_tokens] KV row: block * block_size + offset (-1: not written)
  std::vector<int32_t> block_tables;  // [n_seqs * max_blocks] physical block ids (unused: 0)
  int n_seqs = 0;
  int max_blocks = 0;
  std::vector<int32_t> logit_rows;    // [n_out] indices into tokens whose logits are returned
  int n_tokens() const { return static_cast<int>(tokens.size()); }
};

// The RoPE table of one RoPE config, on the device.
struct DeviceRope {
  Tensor inv_freq;  // f32 [rotary_dim / 2]
  float attn_factor = 1.0f;
};

// The batch on the device (upload_step), what Model::forward reads.
struct StepInputs {
  Tensor tokens, positions, token_seq, slots, block_tables, logit_rows;  // i32, as in Batch
  int n_tokens = 0, n_out = 0, n_seqs = 0, max_blocks = 0, max_position = 0;
  std::vector<DeviceRope> ropes;  // [model.rope_configs().size()] at the step's longest sequence
};

// The rotating cache's kept first tokens (mlx-lm's RotatingKVCache keep=4).
inline constexpr int kKvKeep = 4;

// The paged KV cache storage: per layer K and V (backend::KvTensor), float [n_blocks, block_size,
// n_kv_heads * head_dim] in the backend's activation dtype, or affine-quantized per c.kv_quant
// (codes u32, scales and biases f16, each [n_blocks, block_size, ...]).
struct KvCache {
  int n_blocks = 0, block_size = 0;
  backend::KvQuant quant;
  std::vector<backend::KvTensor> k, v;  // [n_layers]
  // The rotating cache (mlx-lm's --max-kv-size): > 0, a token at position p attends to positions
  // [0, kKvKeep) and [p - (max_kv_size - kKvKeep) + 1, p] (RoPE at absolute positions), so a
  // sequence needs only those blocks (the engine frees the others). 0: off.
  int max_kv_size = 0;
  // The window and sink (AttnParams) of a layer with its own sliding window w (0: none): a window
  // within the rotating one stays as it is; else the rotating cache's.
  void layer_mask(int w, int& window, int& sink) const {
    const bool own = max_kv_size <= 0 || (w > 0 && w <= max_kv_size - kKvKeep);
    window = own ? w : max_kv_size - kKvKeep;
    sink = own ? 0 : kKvKeep;
  }
  static KvCache allocate(backend::Backend& be, const ModelConfig& c, int n_blocks, int block_size);
  size_t bytes() const;
  // Every tensor that holds per-block state, each [n_blocks, ...] (block b is slice_rows(b, b + 1)),
  // in a fixed order: layer by layer, K then V; a quantized cache's K is three planes (codes, scales,
  // biases; mlx-lm's QuantizedKVCache state order), then V's three. Copying a block, saving it to a
  // file or loading it back goes through this list, so a cache layout with more planes extends only this.
  std::vector<Tensor*> planes();
  std::vector<const Tensor*> planes() const;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  backend::Backend& backend() const { return *backend_; }
  // The math of one step: K/V of every input token written into `cache`, and the logits of the
  // rows in.logit_rows returned, f32 [in.n_out, vocab_size] on the backend's device. Buffers,
  // graphs and sampling are the runner's (engine/model_runner.h).
  virtual Tensor forward(const StepInputs& in, KvCache& cache) = 0;
  // Whether a step of n_tokens runs without reading anything back to the host mid-forward (MoE
  // routing on the host does), so that it may be captured as a device graph.
  virtual bool graph_safe(int64_t n_tokens) const { return true; }
  // The distinct RoPE configs the layers use; StepInputs::ropes holds their tables in this order.
  const std::vector<const RopeConfig*>& rope_configs() const { return rope_cfgs_; }

 protected:
  Model(ModelConfig c, backend::Backend& be) : config_(std::move(c)), backend_(&be) {}
  ModelConfig config_;
  backend::Backend* backend_;
  std::vector<const RopeConfig*> rope_cfgs_;  // points into config_; the family fills it
};

// The batch on the device: its index arrays and the model's RoPE tables for the step's longest
// sequence. Called before any op of the step (a graph never captures an upload).
StepInputs upload_step(const Model& m, const Batch& b);

using ModelFactory = std::function<std::unique_ptr<Model>(const ModelConfig&, const io::WeightSet&, backend::Backend&)>;

// Builds the family registered for config.model_type; unknown types fail with the list of known ones.
std::unique_ptr<Model> create_model(const ModelConfig& config, const io::WeightSet& weights, backend::Backend& be);
std::vector<std::string> supported_model_types();

}  // namespace kiln::model
