// --draft-model / --spec-ngram / --num-draft-tokens / --spec-accept: one definition for generate,
// chat and serve, so their flags, checks and errors cannot drift apart.
#include "kiln/cli/spec_args.h"

#include <fmt/format.h>

#include "kiln/base/log.h"

namespace kiln::cli {

void SpecArgs::add_to(CLI::App* cmd, int default_n) {
  num_draft_tokens = default_n;
  CLI::Option* draft =
      cmd->add_option("--draft-model", draft_model,
                      "Speculative decoding: a small model (folder or Hugging Face repo id) that proposes tokens for "
                      "the model to verify, several per forward; it must have the same tokenizer. Loaded on the same "
                      "--device");
  CLI::Option* ngram = cmd->add_flag("--spec-ngram", this->ngram,
                                     "Speculative decoding by prompt lookup: propose the tokens that followed the last "
                                     "n-gram where it occurred before in the prompt or output (no second model)");
  draft->excludes(ngram);
  cmd->add_option("--spec-ngram-min", ngram_min, "Prompt lookup: the shortest n-gram that may match")
      ->check(CLI::Range(1, 64))->needs(ngram)->capture_default_str();
  cmd->add_option("--spec-ngram-max", ngram_max, "Prompt lookup: the longest n-gram tried first")
      ->check(CLI::Range(1, 64))->needs(ngram)->capture_default_str();
  cmd->add_option("--num-draft-tokens", num_draft_tokens,
                  "With --draft-model or --spec-ngram: at most N draft tokens per sequence and step (0 = no drafting); "
                  "the engine picks 0..N per step from measured speed")
      ->check(CLI::Range(0, engine::kMaxDraftTokens))->capture_default_str();
  cmd->add_option("--spec-accept", accept_rule,
                  "How sampled (temp > 0) requests accept draft tokens: residual (accept with min(1, p/q), else draw "
                  "from the residual; more accepted) or exact (mlx-lm: accept while the target's own sample equals the "
                  "draft). Both keep the model's distribution; greedy accepts exact matches either way")
      ->check(CLI::IsMember({"residual", "exact"}))->capture_default_str();
}

engine::SpecAccept SpecArgs::accept() const {
  return accept_rule == "exact" ? engine::SpecAccept::exact : engine::SpecAccept::residual;
}

Drafter SpecArgs::load(const engine::LoadedModel& target, const engine::LoadOptions& opt, int max_batch_tokens) const {
  Drafter d;
  if (ngram) {
    d.source = engine::make_ngram_draft(ngram_min, ngram_max);
  } else if (!draft_model.empty()) {
    try {
      d.model = engine::load_model(draft_model, opt);
    } catch (const Error& e) {  // say which of the two models failed
      fail("speculative", "cannot load the --draft-model: {}", e.what());
    }
    d.source = engine::make_draft_model(*d.model, target, max_batch_tokens);
    log::info("draft model {}: {:.2f} GB of weights, {:.1f} KB of KV per token", d.model->path,
              d.source->weight_bytes() / 1e9, d.source->kv_bytes(1) / 1e3);
  }
  return d;
}

void SpecArgs::apply_to(engine::EngineConfig& ec, const Drafter& d) const {
  ec.spec.draft = d.source.get();
  ec.spec.num_draft_tokens = num_draft_tokens;
  ec.spec.accept = accept();
}

std::string spec_summary(int64_t drafted, int64_t accepted, int64_t verifies) {
  // A verify is one sequence's forward over its pending token and its drafts: it emits the
  // accepted drafts plus one token of the target's own, so (accepted + verifies) / verifies is
  // the tokens each such forward yields (1 without drafting).
  return fmt::format("Speculative: {} drafted, {} accepted ({:.1f}%), {:.2f} tokens per target forward that verified drafts",
                     drafted, accepted, drafted > 0 ? 100.0 * accepted / drafted : 0.0,
                     verifies > 0 ? static_cast<double>(accepted + verifies) / verifies : 1.0);
}

}  // namespace kiln::cli
