// Unicode helpers: utf8proc for categories, case and normalization forms; the GPT-2 byte map;
// lossy UTF-8 repair following the "maximal subpart" rule that Rust's from_utf8_lossy uses.
#include "kiln/tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <memory>

#include "kiln/base/error.h"
#include "kiln/base/utf8.h"

namespace kiln::tokenizer::unicode {

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_numeric(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool is_alphanumeric(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_MC) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

bool is_punctuation(uint32_t cp) {
  if (cp < 0x80) {
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
  }
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

bool is_nonspacing_mark(uint32_t cp) {
  return cp >= 0x300 && utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_MN;
}

static bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  return true;
}

std::string normalize(std::string_view s, Form form) {
  if (is_ascii(s)) return std::string(s);  // every form leaves ASCII unchanged
  int options = UTF8PROC_STABLE;
  switch (form) {
    case Form::nfc: options |= UTF8PROC_COMPOSE; break;
    case Form::nfd: options |= UTF8PROC_DECOMPOSE; break;
    case Form::nfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case Form::nfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                        &out, static_cast<utf8proc_option_t>(options));
  if (n < 0) fail("tokenizer", "unicode normalization failed: {}", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

uint32_t next_char(std::string_view s, size_t& i) { return utf8::decode(s, i); }

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
      ++i;
      continue;
    }
    uint32_t cp = utf8::decode(s, i);
    utf8::append(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

namespace {
// byte -> code point of the GPT-2 alphabet, and the reverse for code points below 0x200.
struct ByteMap {
  std::array<std::string, 256> chars;
  std::array<int16_t, 0x200> bytes;
  ByteMap() {
    bytes.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      utf8::append(chars[b], cp);
      bytes[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

const std::string& byte_char(uint8_t b) { return byte_map().chars[b]; }

int char_byte(uint32_t cp) { return cp < 0x200 ? byte_map().bytes[cp] : -1; }

std::string to_byte_level(std::string_view s) {
  const auto& m = byte_map();
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) out += m.chars[static_cast<uint8_t>(c)];
  return out;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  while (i < n) {
    uint8_t c = byte(i);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // Allowed range of the second byte depends on the lead (Unicode Table 3-7); later bytes are 80..BF.
    int len = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k < static_cast<size_t>(len) && i + k < n; ++k) {
      uint8_t b = byte(i + k);
      uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) break;
    }
    if (k == static_cast<size_t>(len)) {
      out.append(s.substr(i, k));
    } else {
      out += "\xEF\xBF\xBD";  // one replacement for the maximal valid-so-far subpart
    }
    i += k;
  }
  return out;
}

}  // namespace kiln::tokenizer::unicode
