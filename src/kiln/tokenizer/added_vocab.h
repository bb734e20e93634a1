// Added tokens (tokenizer.json "added_tokens", tokenizer_config.json "added_tokens_decoder"):
// matched in the text before normalization (normalized=false) or after it (normalized=true), with
// leftmost-longest priority, and never split by the model. lstrip/rstrip swallow neighbouring
// whitespace; single_word tokens only match between non-word characters.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/tokenizer/bpe.h"

namespace kiln::tokenizer {

class Normalizer;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

class AddedVocab {
 public:
  // Adds a token; a token whose content or id is already present is ignored (the first definition wins).
  void add(const AddedToken& t);
  // Builds the matchers; normalized tokens are matched by their normalized content, as HF does.
  void build(const Normalizer* normalizer);

  // A slice of the text: an added token (id >= 0) or plain text (id = -1).
  struct Segment {
    size_t start, end;
    int32_t id;
  };
  // Splits s by the tokens of one kind (normalized or not) into segments covering s in order
  // (matched whitespace of lstrip/rstrip tokens belongs to the token segment).
  void split(std::string_view s, bool normalized, std::vector<Segment>& out) const;

  const AddedToken* by_id(int32_t id) const;
  std::optional<int32_t> by_content(std::string_view content) const;
  bool is_special(int32_t id) const {
    const AddedToken* t = by_id(id);
    return t && t->special;
  }
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  int32_t max_id() const;

 private:
  // A byte trie over token contents. Node 0 is the root.
  struct Trie {
    std::unordered_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child node
    std::vector<int32_t> terminal{-1};              // node -> index into tokens_, or -1
    bool first_byte[256] = {};
    bool empty() const { return terminal.size() == 1; }
    void insert(std::string_view key, int32_t token_index);
    // Longest key starting at s[pos]: (token index, length) or (-1, 0).
    std::pair<int32_t, size_t> longest(std::string_view s, size_t pos) const;
  };

  std::vector<AddedToken> tokens_;
  TokenMap by_content_;
  std::unordered_map<int32_t, int32_t> by_id_;  // id -> index into tokens_
  Trie raw_, normalized_;
};

}  // namespace kiln::tokenizer
