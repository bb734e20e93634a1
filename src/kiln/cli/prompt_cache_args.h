// --prompt-cache-file for generate and chat (a file `kiln cache-prompt` wrote): read and checked
// before the engine is built, sized into its prefix cache, then imported so that a prompt
// starting with the file's tokens computes only what follows them.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "kiln/chat/prompt.h"
#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/kvstore/prompt_file.h"

namespace kiln::cli {

struct PromptCacheArgs {
  std::string file;  // "" = none
  void add_to(CLI::App* cmd);
  // The file, read and checked against the model and tokenizer (nullopt without the flag).
  std::optional<kvstore::PromptCache> load(const engine::LoadedModel& m) const;
};

// Room in the engine's prefix cache for the file's blocks (at least; a larger cache stays).
void reserve_prompt_cache(const kvstore::PromptCache& pc, const engine::LoadedModel& m, int block_size,
                          engine::EngineConfig& ec);
// Checks the file's KV layout against the engine's and puts its blocks into the prefix cache.
// Returns the tokens whose K/V the cache then holds.
int import_prompt_cache(const kvstore::PromptCache& pc, const std::string& path, engine::Engine& eng);
// What of a rendered conversation follows a cached prompt (mlx-lm's rule): with a template, the
// text from where the first user turn's content starts (the header before it, BOS and the like, is
// what the cache holds); without one the text itself. Encoded without special tokens.
std::string text_after_cache(const chat::Renderer& render, const std::string& rendered);

}  // namespace kiln::cli
