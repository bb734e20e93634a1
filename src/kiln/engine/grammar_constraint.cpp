// GrammarConstraint (grammar_constraint.h).
#include "kiln/engine/grammar_constraint.h"

#include <algorithm>
#include <limits>

namespace kiln::engine {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const grammar::TokenMasker> masker, std::vector<int32_t> stop_ids)
    : masker_(std::move(masker)), matcher_(masker_->grammar()), stop_ids_(std::move(stop_ids)),
      mask_(masker_->table().mask_words()) {}

bool GrammarConstraint::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

bool GrammarConstraint::fill() {
  masker_->fill_mask(matcher_, mask_.data());
  const int32_t n_table = masker_->table().vocab_size();
  for (int32_t id : masker_->table().stop_ids())  // the request's stop ids stand for them
    mask_[id >> 5] &= ~(1u << (id & 31));
  if (matcher_.is_complete())
    for (int32_t id : stop_ids_)
      if (id >= 0 && id < n_table) grammar::mask_set(mask_.data(), id);
  return !std::all_of(mask_.begin(), mask_.end(), [](uint32_t w) { return w == 0; });  // see the header
}

void GrammarConstraint::process(std::span<float> logits, std::span<const int32_t>) {
  if (!fill()) return;
  const int32_t n_table = masker_->table().vocab_size();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int32_t n = static_cast<int32_t>(logits.size());
  for (int32_t id = 0; id < n; ++id)
    if (id >= n_table || !grammar::mask_test(mask_.data(), id)) logits[id] = kNegInf;
}

void GrammarConstraint::mask(std::span<uint32_t> words) {
  if (!fill()) {
    std::fill(words.begin(), words.end(), ~0u);
    return;
  }
  // mask_ covers the tokenizer's ids; the words past them (a padded vocab) stay clear.
  const size_t n = std::min(words.size(), mask_.size());
  std::copy_n(mask_.begin(), n, words.begin());
  std::fill(words.begin() + n, words.end(), 0u);
}

bool GrammarConstraint::accept(int32_t token) {
  if (is_stop(token)) return matcher_.is_complete();
  if (token < 0 || token >= masker_->table().vocab_size()) return false;
  const std::string& bytes = masker_->table().bytes(token);
  return !bytes.empty() && matcher_.accept_bytes(bytes);
}

}  // namespace kiln::engine
