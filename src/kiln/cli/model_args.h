// Flags shared by the subcommands that load a model (--model, --device, KV sizing) and the loading itself,
// so every command resolves the embedded default the same way.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"

namespace kiln::cli {

struct ModelArgs {
  std::string model;           // "" = the embedded default
  std::string device = "auto";
  // KV pool sizing (engine/kv_sizing.h): the fraction of the GPU's memory the process may use,
  // and an explicit pool size that overrides it (also on the CPU, where the fraction is ignored).
  double gpu_memory_utilization = 0.9;
  size_t kv_cache_bytes = 0;
  int max_kv_size = 0;  // the rotating KV cache (EngineConfig::max_kv_size); 0: off
  // The KV cache's quantization (mlx-lm's flags): 0 = float, 8 or 4 bits, groups along head_dim.
  int kv_bits = 0, kv_group_size = 64;
  void add_to(CLI::App* cmd);
  // --max-kv-size (generate, chat, cache-prompt).
  void add_max_kv_size_to(CLI::App* cmd);
  // --device resolved ("auto" -> cuda when a GPU is present): a draft model loads with the same.
  engine::LoadOptions load_options() const;
  std::unique_ptr<engine::LoadedModel> load() const;
  // Puts the KV sizing flags (and --max-kv-size) into an engine's config.
  void apply_to(engine::EngineConfig& ec) const;
};

// Peak resident memory of this process so far, in bytes.
size_t peak_rss_bytes();

}  // namespace kiln::cli
