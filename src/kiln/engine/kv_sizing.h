// Sizing the paged KV pool: how many blocks the engine allocates, from what the workload can use
// (sequences x context, or an explicit count), an explicit --kv-cache-bytes, the prefix cache's
// wish, and on a GPU the --gpu-memory-utilization budget (a fraction of the device's total memory
// that weights, per-step activations and the pool must fit in). Pure functions: tested without a GPU.
#pragma once
#include <cstddef>

#include "kiln/model/model.h"

namespace kiln::engine {

struct KvPoolRequest {
  size_t bytes_per_block = 0;        // K and V of one block over every layer, in the cache dtype
  size_t cached_bytes_per_block = 0; // a prefix-cache block (0: bytes_per_block; a draft's K/V is not cached)
  int wanted_blocks = 0;             // what the workload can use (explicit n_blocks, or max_seqs x context)
  size_t kv_cache_bytes = 0;         // explicit pool size for running sequences; 0: wanted_blocks
  size_t prompt_cache_bytes = 0;     // prefix cache blocks wished for beside them (at most 4x as many)
  double gpu_memory_utilization = 0; // > 0 with a device: the pool is capped to fit the budget
  size_t device_total = 0, device_free = 0;  // the device's memory now (weights loaded); 0: host backend
  size_t activation_reserve = 0;     // per-step buffers still to come, kept out of the pool
};

struct KvPoolPlan {
  int active_blocks = 0;   // for running sequences
  int cached_blocks = 0;   // extra, for the prefix cache
  size_t budget_bytes = 0; // the device budget left for KV (0: none applied)
  bool capped = false;     // the budget cut the pool below what the workload wanted
};

// The plan; fails ([engine], naming the flag to change) when not one block fits.
// Rules: an explicit kv_cache_bytes gives the active pool and must fit in the free memory less
// the reserve (the fraction does not apply to it); otherwise the wanted pool is capped to
//   budget = utilization x total - (total - free) - reserve
// (everything already on the device counts, weights included), and the prefix cache gets what
// is left of the budget, at most its wish.
KvPoolPlan plan_kv_pool(const KvPoolRequest& r);

// How many rows of blocks_per_row blocks each (evaluation forwards: every row holds its whole
// length) fit the plan of r with r.wanted_blocks = wanted_rows x blocks_per_row: at most
// wanted_rows, and at least 1 or it fails naming the flags to raise.
int rows_that_fit(KvPoolRequest r, int blocks_per_row, int wanted_rows);

// Bytes of one KV block: 2 (K and V) x n_layers x block_size x the bytes of one row of n_kv_heads x
// head_dim values: x elem_bytes for a float cache, codes + f16 scales/biases under c.kv_quant.
size_t kv_bytes_per_block(const model::ModelConfig& c, int block_size, size_t elem_bytes);
// The same for a loaded model: its cache holds K/V in its backend's activation dtype.
size_t kv_bytes_per_block(const model::Model& m, int block_size);

// An upper estimate of the per-step device buffers of a step of max_batch_tokens tokens: the
// residual stream and layer temporaries (q, k, v, attention output, gate/up, MoE expert rows),
// logits f32 for every token (prompt logprobs may ask for all), +25% for the arena's growth
// margin, plus 256 MiB for cuBLAS, graphs, attention partials and fragmentation.
size_t activation_reserve_bytes(const model::ModelConfig& c, int max_batch_tokens, size_t act_bytes);

}  // namespace kiln::engine
