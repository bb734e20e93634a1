// UTF-8 helpers: validation, code point decoding and encoding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::utf8 {

// Bytes in the sequence that starts with lead byte c (1..4), or 0 for a continuation/invalid byte.
int sequence_length(uint8_t c);
// True when s is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid(std::string_view s);
// Appends code point cp as UTF-8.
void append(std::string& out, uint32_t cp);
// Decodes the code point at s[i], advancing i; invalid bytes decode as U+FFFD, one byte each.
uint32_t decode(std::string_view s, size_t& i);

}  // namespace kiln::utf8
