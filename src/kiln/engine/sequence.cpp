// Sequence construction and finish-reason names.
#include "kiln/engine/sequence.h"

namespace kiln::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "?";
}

Sequence::Sequence(int64_t id_, Request r)
    : id(id_),
      tokens(std::move(r.prompt)),
      n_prompt(static_cast<int>(tokens.size())),
      sampler(std::move(r.sampling)),
      max_tokens(r.max_tokens),
      stop_ids(std::move(r.stop_ids)),
      on_event(std::move(r.on_event)),
      logprobs(r.logprobs),
      prompt_logprobs(r.prompt_logprobs),
      reuse_prefix(r.reuse_prefix && r.prompt_logprobs < 0),
      num_draft_tokens(r.num_draft_tokens) {
  if (prompt_logprobs >= 0) prompt_lp.resize(n_prompt);
  if (r.grammar) {
    grammar = std::make_unique<GrammarConstraint>(std::move(r.grammar), stop_ids);
    processors.push_back(grammar.get());
  }
}

}  // namespace kiln::engine
