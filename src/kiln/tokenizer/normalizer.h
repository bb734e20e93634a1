// Normalizers of tokenizer.json ("normalizer"): NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents,
// Replace, Prepend, ByteLevel, Precompiled (approximated by NFKC) and Sequence. Each rewrites one
// piece of text (the text between added tokens), as HF `tokenizers` does.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kiln/base/json.h"

namespace kiln::tokenizer {

class Regex;

// Nesting limit of Sequence normalizers / pre-tokenizers / decoders (hostile files cannot blow the stack).
constexpr int kMaxNesting = 32;

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

// Builds the normalizer described by `j` (an object with "type"); null -> nullptr.
// Unknown types throw "[tokenizer] <where>: unsupported normalizer type "X"".
std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& where, int depth = 0);

// The {"String": s} / {"Regex": r} pattern object of Split and Replace. A String pattern is literal.
struct Pattern {
  std::string literal;  // used when regex is null
  std::shared_ptr<Regex> regex;
};
Pattern parse_pattern(const Json& j, const std::string& where);
// Calls on_match(start, end) for each non-overlapping match of the pattern in s.
void for_each_match(const Pattern& p, std::string_view s, const std::function<void(size_t, size_t)>& on_match);
std::string replace_all(const Pattern& p, std::string_view s, std::string_view with);

// Small typed accessors used by all tokenizer.json readers: a wrong type is a one-line error.
std::string json_str(const Json& j, const char* key, const std::string& where, const std::string& dflt = "");
bool json_bool(const Json& j, const char* key, const std::string& where, bool dflt);
int64_t json_int(const Json& j, const char* key, const std::string& where, int64_t dflt);
const std::string& json_type(const Json& j, const std::string& where);

}  // namespace kiln::tokenizer
