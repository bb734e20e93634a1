// PCRE2 (8-bit, UTF + UCP) behind the small Regex interface. JIT-compiled when the platform allows;
// a match that overflows the default JIT stack is retried once with a large private stack.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "kiln/tokenizer/regex.h"

#include <pcre2.h>

#include "kiln/base/error.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::tokenizer {

namespace {
std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}
// Backtracking limits: generous for real pre-tokenizer patterns, finite for hostile ones.
constexpr uint32_t kMatchLimit = 10'000'000;
constexpr uint32_t kDepthLimit = 1'000'000;
}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : pattern_(pattern), where_(where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C, &err, &offset, nullptr);
  if (!code) {
    fail("tokenizer", "{}: regex /{}/ does not compile: {} at offset {}", where, pattern, pcre2_message(err),
         static_cast<size_t>(offset));
  }
  // \C (one byte in UTF mode) is refused above: a match must never end inside a character.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // failure is fine: the interpreter is used instead
  code_ = code;
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(ctx, kMatchLimit);
  pcre2_set_depth_limit(ctx, kDepthLimit);
  context_ = ctx;
}

Regex::~Regex() {
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::find_all(std::string_view s, const std::function<void(size_t, size_t)>& on_match) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* ctx = static_cast<pcre2_match_context*>(context_);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  // Created on the first JIT stack overflow only; owned by this call so threads never share it.
  std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)> big_stack(nullptr, &pcre2_jit_stack_free);
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> big_ctx(nullptr,
                                                                                    &pcre2_match_context_free);
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    // The subject was validated (or repaired) by the caller, so skip PCRE2's UTF check on each call.
    int rc = pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), big_ctx ? big_ctx.get() : ctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !big_ctx) {
      big_stack.reset(pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr));
      big_ctx.reset(pcre2_match_context_copy(ctx));
      pcre2_jit_stack_assign(big_ctx.get(), nullptr, big_stack.get());
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      fail("tokenizer", "{}: regex /{}/ failed on a {}-byte text: {}", where_, pattern_, s.size(), pcre2_message(rc));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t start = ov[0], end = ov[1];
    if (start > end || end > s.size()) return;  // \K tricks can report odd ranges; stop there
    on_match(start, end);
    if (end > start) {
      pos = end;
    } else {
      if (start >= s.size()) return;
      pos = start + unicode::char_len(s, start);
    }
  }
}

std::string Regex::replace_all(std::string_view s, std::string_view with) const {
  std::string out;
  out.reserve(s.size());
  size_t prev = 0;
  find_all(s, [&](size_t start, size_t end) {
    if (start < prev) return;
    out.append(s.substr(prev, start - prev));
    out.append(with);
    prev = end;
  });
  out.append(s.substr(prev));
  return out;
}

}  // namespace kiln::tokenizer
