// Speculative decoding flags shared by generate, chat and serve (--draft-model, --num-draft-tokens,
// --spec-ngram, --spec-accept), loading the draft source they name, and the --verbose summary.
// The engine holds a raw pointer to the source (SpecConfig::draft), so the caller owns a Drafter
// and declares it before the Engine: it must outlive every engine built on it.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/engine/speculative.h"

namespace kiln::cli {

// What the flags loaded: the draft source (null: no drafting) and the draft model it runs.
struct Drafter {
  std::unique_ptr<engine::LoadedModel> model;   // --draft-model only
  std::unique_ptr<engine::DraftSource> source;
};

struct SpecArgs {
  std::string draft_model;  // folder or HF repo id; "" = none
  bool ngram = false;       // prompt lookup
  int ngram_min = 2, ngram_max = 4;
  int num_draft_tokens = 0;  // set by add_to (the command's default)
  std::string accept_rule = "residual";  // --spec-accept
  engine::SpecAccept accept() const;

  // default_n: mlx-lm's default for the command (generate 2, server 3).
  void add_to(CLI::App* cmd, int default_n);
  // Loads the draft model (on the target's device, checked against its tokenizer) or builds the
  // lookup source. Throws kiln::Error with nothing left loaded. max_batch_tokens: the engine's.
  Drafter load(const engine::LoadedModel& target, const engine::LoadOptions& opt, int max_batch_tokens) const;
  void apply_to(engine::EngineConfig& ec, const Drafter& d) const;
};

// "Speculative: D drafted, A accepted (P%), T tokens per verify" for --verbose.
std::string spec_summary(int64_t drafted, int64_t accepted, int64_t verifies);

}  // namespace kiln::cli
