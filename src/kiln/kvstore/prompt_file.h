// Prompt cache files (`kiln cache-prompt`, `--prompt-cache-file`): a prompt's token ids and the
// K/V of its full blocks, in one safetensors file. Tensors named as mlx-lm flattens a cache's state:
// "{layer}.{i}" (i = 0 keys, 1 values) for a float cache, "{layer}.{k}.{j}" for a quantized one
// (k = 0 keys, 1 values; j = 0 codes u32, 1 scales, 2 biases f16: QuantizedKVCache's triples),
// each [n_cached_tokens, ...], one row per token, so that a cache of any block size can take them.
// "__metadata__":
//   format "kiln.prompt_cache", version, model (path, for messages), model_fingerprint and
//   tokenizer_fingerprint (16 hex digits, identity.h), tokens (JSON array, the whole prompt),
//   block_size (of the cache that made it), n_layers, n_cached_tokens (tokens with K/V: the full
//   blocks; the few tokens of a last partial block are recomputed on load), kv_layout
//   (KvLayout::describe), max_kv_size (only when made with a rotating cache, `--max-kv-size`: the
//   K/V then cover at most the blocks before that many tokens, and a run continues from the file only
//   with the same setting), kv_bits and kv_group_size (0 0: float; absent in older files: float),
//   and checksum (XXH3-64 of the tensor bytes and the metadata above).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/kvstore/kv_blocks.h"

namespace kiln::kvstore {

inline constexpr int kPromptCacheVersion = 1;

struct PromptCache {
  std::string model;
  uint64_t model_fingerprint = 0, tokenizer_fingerprint = 0;
  std::vector<int32_t> tokens;
  KvLayout layout;         // of the cache it was made from
  int n_layers = 0;
  int n_blocks = 0;        // full blocks stored (of layout.block_size tokens)
  int max_kv_size = 0;     // the rotating cache it was made with (EngineConfig::max_kv_size); 0: none
  std::vector<std::byte> data;  // [n_blocks][layout.block_bytes], as Engine::export_prefix gives
  int n_cached_tokens() const { return n_blocks * layout.block_size; }
};

// The cached rows regrouped into blocks of `layout` (the loading cache's: its block size may differ
// from the file's; planes must match, see check_prompt_cache_layout): [n][layout.block_bytes], n = the
// full blocks of that size within the cached tokens.
std::vector<std::byte> reblock(const PromptCache& pc, const KvLayout& layout, int& n);

// Writes the file atomically (temporary file, then rename).
void save_prompt_cache(const std::string& path, const PromptCache& pc);
// Reads and checks a file (structure, version, checksum); kiln::Error naming the file and what is
// wrong otherwise ("truncated", "checksum mismatch", "format version 2", ...).
PromptCache load_prompt_cache(const std::string& path);
// Refuses a file made for another model, tokenizer or KV layout (a plane's dtype or per-token
// shape: --kv-bits, --kv-group-size, the device's KV dtype), saying which differs and how to make
// a matching one. The block size may differ (see reblock).
void check_prompt_cache_model(const PromptCache& pc, const std::string& path, uint64_t model_fingerprint,
                              uint64_t tokenizer_fingerprint);
void check_prompt_cache_layout(const PromptCache& pc, const std::string& path, const KvLayout& layout);
// Refuses a file made with another --max-kv-size than this run's (0: off).
void check_prompt_cache_rotation(const PromptCache& pc, const std::string& path, int max_kv_size);

}  // namespace kiln::kvstore
