// Unicode helpers for the tokenizer: character classes with the meaning HF `tokenizers` (Rust) gives
// them, normalization forms through utf8proc, the GPT-2 byte <-> character map of byte-level BPE,
// and lossy UTF-8 repair. Everything works on UTF-8 std::string / std::string_view.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::tokenizer::unicode {

// Rust char::is_whitespace (the White_Space property).
bool is_whitespace(uint32_t cp);
// Rust char::is_numeric (general categories Nd, Nl, No).
bool is_numeric(uint32_t cp);
// Rust char::is_alphanumeric, approximated as letters (L*), Nl, combining marks, and numerics.
bool is_alphanumeric(uint32_t cp);
// HF's is_punc: ASCII punctuation or a Unicode P* category.
bool is_punctuation(uint32_t cp);
// Unicode Mn (what HF StripAccents removes after NFD).
bool is_nonspacing_mark(uint32_t cp);

enum class Form { nfc, nfd, nfkc, nfkd };
// Normalizes valid UTF-8; ASCII input is returned unchanged without calling utf8proc.
std::string normalize(std::string_view s, Form form);
// Simple per-code-point lowercase mapping.
std::string lowercase(std::string_view s);

// The GPT-2 byte-level alphabet: byte b is shown as the UTF-8 string byte_char(b) (printable
// bytes map to themselves, the rest to U+0100 + n in order).
const std::string& byte_char(uint8_t b);
// The byte that code point cp stands for in that alphabet, or -1.
int char_byte(uint32_t cp);
// Maps every byte of s to its byte-level character.
std::string to_byte_level(std::string_view s);

// Valid UTF-8 with each maximal invalid subsequence replaced by U+FFFD (Rust from_utf8_lossy).
std::string to_valid_utf8(std::string_view s);
// Number of bytes of the character that starts at s[i] (1 for invalid bytes); s must be valid UTF-8
// for the multi-byte answer to be meaningful.
inline size_t char_len(std::string_view s, size_t i) {
  uint8_t c = static_cast<uint8_t>(s[i]);
  size_t n = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  return n <= s.size() - i ? n : 1;
}
// Decodes the (valid) character at s[i] and advances i.
uint32_t next_char(std::string_view s, size_t& i);

}  // namespace kiln::tokenizer::unicode
