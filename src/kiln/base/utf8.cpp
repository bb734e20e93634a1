// UTF-8 per RFC 3629.
#include "kiln/base/utf8.h"

namespace kiln::utf8 {

int sequence_length(uint8_t c) {
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  if (c < 0xE0) return 2;
  if (c < 0xF0) return 3;
  if (c < 0xF5) return 4;
  return 0;
}

uint32_t decode(std::string_view s, size_t& i) {
  uint8_t c = static_cast<uint8_t>(s[i]);
  int n = sequence_length(c);
  if (n == 1) {
    ++i;
    return c;
  }
  if (n == 0 || i + n > s.size()) {
    ++i;
    return 0xFFFD;
  }
  uint32_t cp = c & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    uint8_t b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
    ++i;
    return 0xFFFD;
  }
  i += n;
  return cp;
}

bool valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t before = i;
    uint32_t cp = decode(s, i);
    if (cp == 0xFFFD && !(i - before == 3 && s.substr(before, 3) == "\xEF\xBF\xBD")) return false;
  }
  return true;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace kiln::utf8
