// A sequence's grammar constraint (structured output): the LogitsProcessor that masks each row
// about to be sampled to the tokens its grammar state allows, and that state, advanced by every
// emitted token and rolled back with rejected drafts (speculative decoding).
//
// Masking: the TokenMasker's mask of the Matcher's state; disallowed logits become -inf. The
// tokenizer's EOS (the TokenTable's stop ids) is replaced by the request's stop ids, allowed only
// when the grammar is complete; once nothing can follow, only they remain (and the engine ends
// the sequence without waiting for one: done()). A state that allows no token at all leaves the
// row unmasked; the engine then rejects the sampled token (accept() is false) and ends the
// sequence with finish reason "length", as when max_tokens comes before the grammar completes.
// With device sampling (CUDA) the runner asks for mask() instead, while the forward runs, and the
// device applies it (Backend::sample_rows' TokenMasks); speculative verifies stay on the host.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "kiln/engine/model_runner.h"
#include "kiln/grammar/token_mask.h"

namespace kiln::engine {

class GrammarConstraint final : public LogitsProcessor {
 public:
  GrammarConstraint(std::shared_ptr<const grammar::TokenMasker> masker, std::vector<int32_t> stop_ids);
  // logits [vocab] (the model's vocab may be padded past the tokenizer's: those ids are masked too).
  void process(std::span<float> logits, std::span<const int32_t> context) override;
  bool is_mask() const override { return true; }
  // words [ceil(vocab / 32)] for the model's vocab (ids past the tokenizer's are cleared); all set
  // when the state allows no token (see above).
  void mask(std::span<uint32_t> words) override;
  // Advances by an emitted token; false (state unchanged) when the grammar does not allow it.
  bool accept(int32_t token);
  // Takes back the last n accepted tokens (stop tokens are not counted: they end the sequence).
  void rollback(size_t n) { matcher_.rollback(n); }
  size_t n_tokens() const { return matcher_.n_tokens(); }
  bool complete() const { return matcher_.is_complete(); }
  // Complete and no byte may follow: the output is finished.
  bool done() const { return matcher_.is_complete() && !matcher_.can_continue(); }

 private:
  bool is_stop(int32_t id) const;
  bool fill();  // mask_ for the state; false when it allows nothing

  std::shared_ptr<const grammar::TokenMasker> masker_;
  grammar::Matcher matcher_;
  std::vector<int32_t> stop_ids_;
  grammar::Mask mask_;
};

}  // namespace kiln::engine
