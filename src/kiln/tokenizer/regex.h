// A compiled PCRE2 pattern in UTF + UCP mode (JIT when available), used by Split pre-tokenizers,
// Replace normalizers/decoders and the ByteLevel GPT-2 pattern. Matching is thread-safe: each call
// uses its own match data. Subjects must be valid UTF-8 (the tokenizer repairs input first).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace kiln::tokenizer {

class Regex {
 public:
  // Throws kiln::Error "[tokenizer] <where>: regex /pattern/ does not compile: reason at offset N".
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(start, end) for each non-overlapping match left to right, like Oniguruma's
  // find_iter: an empty match is reported and the search resumes one character later.
  // A pattern that runs past the backtracking limit throws kiln::Error.
  void find_all(std::string_view s, const std::function<void(size_t, size_t)>& on_match) const;
  // Replaces every match with `with` (literal text).
  std::string replace_all(std::string_view s, std::string_view with) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string where_;
  void* code_ = nullptr;     // pcre2_code_8*
  void* context_ = nullptr;  // pcre2_match_context_8* with the backtracking limits
};

}  // namespace kiln::tokenizer
