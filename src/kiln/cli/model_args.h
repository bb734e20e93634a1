// Flags shared by the subcommands that load a model (--model, --device) and the loading itself,
// so every command resolves the embedded default the same way.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kiln/engine/loader.h"

namespace kiln::cli {

struct ModelArgs {
  std::string model;           // "" = the embedded default
  std::string device = "auto";
  void add_to(CLI::App* cmd);
  std::unique_ptr<engine::LoadedModel> load() const;
};

// Peak resident memory of this process so far, in bytes.
size_t peak_rss_bytes();

}  // namespace kiln::cli
