// plan_kv_pool and the byte estimates behind it (see kv_sizing.h for the rules).
#include "kiln/engine/kv_sizing.h"

#include <algorithm>

#include "kiln/backend/kv_quant.h"
#include "kiln/base/json.h"

namespace kiln::engine {

namespace {

double gb(double b) { return b / 1e9; }

}  // namespace

KvPoolPlan plan_kv_pool(const KvPoolRequest& r) {
  KILN_ASSERT(r.bytes_per_block > 0, "plan_kv_pool: bytes_per_block is 0");
  const size_t bpb = r.bytes_per_block, cbpb = r.cached_bytes_per_block ? r.cached_bytes_per_block : bpb;
  KvPoolPlan p;
  if (r.kv_cache_bytes > 0) {
    if (r.kv_cache_bytes < bpb)
      fail("engine", "--kv-cache-bytes {} is less than one KV block of this model ({} bytes); raise it",
           r.kv_cache_bytes, bpb);
    p.active_blocks = static_cast<int>(std::min<size_t>(r.kv_cache_bytes / bpb, INT32_MAX / 2));
  } else {
    p.active_blocks = std::max(1, r.wanted_blocks);
  }
  p.cached_blocks =
      static_cast<int>(std::min<size_t>(r.prompt_cache_bytes / cbpb, 4ull * static_cast<size_t>(p.active_blocks)));
  if (r.device_total == 0) return p;  // a host backend: nothing to budget

  const size_t avail = r.device_free > r.activation_reserve ? r.device_free - r.activation_reserve : 0;
  if (r.kv_cache_bytes > 0) {
    // Explicit: must fit in what is free; the prefix cache takes what is left of that.
    const size_t need = static_cast<size_t>(p.active_blocks) * bpb;
    if (need > avail)
      fail("engine", "--kv-cache-bytes {} ({:.2f} GB) does not fit: the device has {:.2f} GB free after the weights, "
           "{:.2f} GB of which are kept for activations; lower --kv-cache-bytes", r.kv_cache_bytes, gb(need),
           gb(r.device_free), gb(r.activation_reserve));
    p.cached_blocks = static_cast<int>(std::min<size_t>(p.cached_blocks, (avail - need) / cbpb));
    return p;
  }
  if (r.gpu_memory_utilization <= 0) return p;
  if (r.gpu_memory_utilization > 1)
    fail("engine", "--gpu-memory-utilization {} must be a fraction in (0, 1]", r.gpu_memory_utilization);
  const double used = static_cast<double>(r.device_total - std::min(r.device_free, r.device_total));
  double budget = r.gpu_memory_utilization * static_cast<double>(r.device_total) - used -
                  static_cast<double>(r.activation_reserve);
  budget = std::min(budget, static_cast<double>(avail));
  const double blocks = budget > 0 ? budget / static_cast<double>(bpb) : 0.0;
  if (blocks < 1)
    fail("engine", "--gpu-memory-utilization {} leaves no room for the KV cache: {:.2f} of the device's {:.2f} GB "
         "are in use (weights and other processes) and {:.2f} GB are kept for activations; raise it or pass "
         "--kv-cache-bytes", r.gpu_memory_utilization, gb(used), gb(static_cast<double>(r.device_total)),
         gb(static_cast<double>(r.activation_reserve)));
  const int fit = static_cast<int>(std::min<double>(blocks, INT32_MAX / 2));
  p.budget_bytes = static_cast<size_t>(budget);
  if (p.active_blocks > fit) {
    p.active_blocks = fit;
    p.cached_blocks = 0;
    p.capped = true;
  } else {
    const double left = budget - static_cast<double>(p.active_blocks) * static_cast<double>(bpb);
    p.cached_blocks = static_cast<int>(std::min<double>(p.cached_blocks, left / static_cast<double>(cbpb)));
  }
  return p;
}

int rows_that_fit(KvPoolRequest r, int blocks_per_row, int wanted_rows) {
  KILN_ASSERT(blocks_per_row > 0 && wanted_rows > 0, "rows_that_fit: empty rows");
  r.wanted_blocks = blocks_per_row * wanted_rows;
  r.prompt_cache_bytes = 0;
  const KvPoolPlan p = plan_kv_pool(r);
  const int rows = std::min(wanted_rows, p.active_blocks / blocks_per_row);
  if (rows < 1)
    fail("engine", "one row needs {} KV blocks ({:.3f} GB) but the KV cache holds {} ({:.3f} GB); raise "
         "--kv-cache-bytes or --gpu-memory-utilization, or shorten the rows", blocks_per_row,
         gb(static_cast<double>(blocks_per_row) * r.bytes_per_block), p.active_blocks,
         gb(static_cast<double>(p.active_blocks) * r.bytes_per_block));
  return rows;
}

size_t kv_bytes_per_block(const model::ModelConfig& c, int block_size, size_t elem_bytes) {
  const int64_t width = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  return 2ull * static_cast<size_t>(c.n_layers) * static_cast<size_t>(block_size) *
         backend::kv_row_bytes(c.kv_quant, width, elem_bytes);
}

size_t kv_bytes_per_block(const model::Model& m, int block_size) {
  return kv_bytes_per_block(m.config(), block_size, dtype_size(m.backend().act_dtype()));
}

size_t activation_reserve_bytes(const model::ModelConfig& c, int max_batch_tokens, size_t act_bytes) {
  const size_t n = static_cast<size_t>(std::max(1, max_batch_tokens));
  const size_t q = static_cast<size_t>(c.n_heads) * c.head_dim, kv = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  size_t ffn = static_cast<size_t>(c.ffn_dim), expert_rows = 0;
  if (c.raw.is_object()) {  // MoE: each token's rows go to top_k experts
    const size_t top_k = c.raw.value("num_experts_per_tok", 0);
    const size_t moe_ffn = c.raw.value("moe_intermediate_size", static_cast<size_t>(c.ffn_dim));
    if (top_k > 0) {
      ffn = std::max(ffn, moe_ffn * top_k);
      expert_rows = static_cast<size_t>(c.dim) * top_k * 2;
    }
  }
  const size_t per_token = (4 * static_cast<size_t>(c.dim) + 2 * q + 2 * kv + 3 * ffn + expert_rows) * act_bytes;
  const size_t logits = n * static_cast<size_t>(c.vocab_size) * 4;
  return (per_token * n + logits) / 4 * 5 + (256ull << 20);
}

}  // namespace kiln::engine
