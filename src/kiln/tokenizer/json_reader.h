// One-pass reader of tokenizer.json (nlohmann's SAX interface). model.vocab and model.merges, nearly all
// of a large file (Llama 3: 128k tokens, 280k merges), go straight into their tables; every other value
// becomes an ordinary Json DOM. This halves the load time of large tokenizers compared with a full DOM.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/tokenizer/bpe.h"

namespace kiln::tokenizer {

struct TokenizerJsonParts {
  Json doc;                 // the file, less model.vocab (when an object) and model.merges (when a list)
  bool has_vocab = false;
  TokenMap vocab;
  // Merges in file order: [a, b] pairs (is_pair), or "a b" strings kept whole in `a` (split later,
  // since tokens may hold spaces and the split needs the vocabulary).
  struct Merge {
    std::string a, b;
    bool is_pair;
  };
  std::vector<Merge> merges;
};

// Throws "[tokenizer] <where>: invalid JSON: ..." or a one-line error on a mistyped vocab/merge entry.
TokenizerJsonParts read_tokenizer_json(const std::string& text, const std::string& where);

}  // namespace kiln::tokenizer
