// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): ByteLevel, Split, Digits, Metaspace,
// Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit and Sequence.
// Each one splits (and may rewrite) pieces of normalized text; the BPE model then runs on each piece.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kiln/base/json.h"

namespace kiln::tokenizer {

// A piece of text on its way to the model. at_start: the piece begins at offset 0 of the input
// text (Metaspace's prepend_scheme "first" adds the ▁ only there).
struct Piece {
  std::string text;
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits, in order. Empty pieces are dropped.
  virtual void split(std::vector<Piece>& pieces) const = 0;
};

// null -> nullptr. Unknown types throw "[tokenizer] <where>: unsupported pre_tokenizer type "X"".
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& where, int depth = 0);

// The GPT-2 pattern used by ByteLevel(use_regex=true).
extern const char* const kGpt2Pattern;

}  // namespace kiln::tokenizer
