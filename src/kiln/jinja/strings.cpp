// Python str semantics over UTF-8 (see strings.h). Case mapping and classification use
// glibc's C.UTF-8 tables through *_l functions, so the process locale is never changed.
#include "kiln/jinja/strings.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <stdexcept>

#include "kiln/base/utf8.h"

namespace kiln::jinja::pystr {
namespace {

locale_t utf8_locale() {
  static locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    return l ? l : newlocale(LC_CTYPE_MASK, "C", static_cast<locale_t>(nullptr));
  }();
  return loc;
}

char32_t up1(char32_t c) { return c < 128 ? (c >= 'a' && c <= 'z' ? c - 32 : c) : towupper_l(c, utf8_locale()); }
char32_t low1(char32_t c) { return c < 128 ? (c >= 'A' && c <= 'Z' ? c + 32 : c) : towlower_l(c, utf8_locale()); }

// Full upper mapping for the one common character whose upper case is two letters.
void append_upper(std::u32string& out, char32_t c) {
  if (c == 0xDF) {
    out += U"SS";
  } else {
    out += up1(c);
  }
}

bool is_cased(char32_t c) { return is_upper(c) || is_lower(c); }

bool in_set(char32_t c, const std::u32string& set) { return set.find(c) != std::u32string::npos; }

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

}  // namespace

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(kiln::utf8::decode(s, i));
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) kiln::utf8::append(out, c);
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_space(char32_t c) {
  if (c < 128) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}
bool is_alpha(char32_t c) {
  if (c < 128) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return iswalpha_l(c, utf8_locale());
}
bool is_digit(char32_t c) {
  if (c < 128) return c >= '0' && c <= '9';
  return iswalnum_l(c, utf8_locale()) && !iswalpha_l(c, utf8_locale());
}
bool is_alnum(char32_t c) { return is_alpha(c) || is_digit(c); }
bool is_upper(char32_t c) { return c < 128 ? (c >= 'A' && c <= 'Z') : iswupper_l(c, utf8_locale()); }
bool is_lower(char32_t c) { return c < 128 ? (c >= 'a' && c <= 'z') : iswlower_l(c, utf8_locale()); }

bool is_printable(char32_t c) {
  if (c < 128) return c >= 0x20 && c < 0x7F;
  if (c < 0xA0 || c == 0xAD) return false;  // C1 controls, soft hyphen (Cf)
  if (is_space(c)) return false;            // Zs/Zl/Zp other than ' '
  if ((c >= 0x200B && c <= 0x200F) || (c >= 0x202A && c <= 0x202E) || (c >= 0x2060 && c <= 0x206F) ||
      c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) || (c >= 0x0600 && c <= 0x0605) || c == 0x061C || c == 0x06DD ||
      c == 0x070F || c == 0x180E || (c >= 0xE0000 && c <= 0xE007F))
    return false;  // Cf
  if ((c >= 0xD800 && c <= 0xF8FF) || c >= 0xF0000) return false;  // surrogates, private use
  return iswprint_l(c, utf8_locale());  // unassigned code points are not printable
}

std::string upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode(s)) append_upper(out, c);
  return encode(out);
}

std::string lower(std::string_view s) {
  std::u32string u = decode(s);
  for (auto& c : u) c = low1(c);
  return encode(u);
}

std::string title(std::string_view s) {
  std::u32string out;
  bool previous_cased = false;
  for (char32_t c : decode(s)) {
    if (previous_cased) {
      out += low1(c);
    } else {
      append_upper(out, c);
    }
    previous_cased = is_cased(c);
  }
  return encode(out);
}

std::string capitalize(std::string_view s) {
  std::u32string u = decode(s), out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0) {
      append_upper(out, u[i]);
    } else {
      out += low1(u[i]);
    }
  }
  return encode(out);
}

std::string swapcase(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode(s)) {
    if (is_upper(c)) {
      out += low1(c);
    } else if (is_lower(c)) {
      append_upper(out, c);
    } else {
      out += c;
    }
  }
  return encode(out);
}

bool all_cased(std::string_view s, bool upper) {
  bool any = false;
  for (char32_t c : decode(s)) {
    if (upper ? is_lower(c) : is_upper(c)) return false;
    any |= is_cased(c);
  }
  return any;
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::u32string u = decode(s);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strippable = [&](char32_t c) { return chars ? in_set(c, set) : is_space(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strippable(u[b])) ++b;
  if (right)
    while (e > b && strippable(u[e - 1])) --e;
  return encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string u = decode(s);
  size_t i = 0, n = u.size();
  while (true) {
    while (i < n && is_space(u[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(encode(std::u32string_view(u).substr(i)));
      break;
    }
    size_t j = i;
    while (j < n && !is_space(u[j])) ++j;
    out.push_back(encode(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::u32string u = decode(s);
  size_t e = u.size();
  while (true) {
    while (e > 0 && is_space(u[e - 1])) --e;
    if (e == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(encode(std::u32string_view(u).substr(0, e)));
      break;
    }
    size_t b = e;
    while (b > 0 && !is_space(u[b - 1])) --b;
    out.push_back(encode(std::u32string_view(u).substr(b, e - b)));
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  std::u32string u = decode(s);
  size_t i = 0, n = u.size();
  while (i < n) {
    size_t j = i;
    while (j < n && !is_line_break(u[j])) ++j;
    size_t eol = j;
    if (j < n) {
      eol = (u[j] == '\r' && j + 1 < n && u[j + 1] == '\n') ? j + 2 : j + 1;
    }
    out.push_back(encode(std::u32string_view(u).substr(i, (keepends ? eol : j) - i)));
    i = eol;
  }
  return out;
}

std::string replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count) {
  std::string out;
  if (old_s.empty()) {
    std::u32string u = decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      if (i < u.size()) kiln::utf8::append(out, u[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old_s, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(new_s);
    pos = hit + old_s.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(length(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

int64_t find(std::string_view s, std::string_view sub, bool reverse) {
  size_t hit = reverse ? s.rfind(sub) : s.find(sub);
  if (hit == std::string_view::npos) return -1;
  return static_cast<int64_t>(length(s.substr(0, hit)));
}

std::string pad(std::string_view s, int64_t width, char32_t fill, char align) {
  int64_t len = static_cast<int64_t>(length(s));
  int64_t marg = width - len;
  if (marg <= 0) return std::string(s);
  if (marg > (int64_t{1} << 26)) throw std::length_error("padding width too large");
  int64_t left = align == '<' ? 0 : align == '>' ? marg : marg / 2 + (marg & width & 1);
  std::string f;
  kiln::utf8::append(f, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += f;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += f;
  return out;
}

std::string repr(std::string_view s) {
  std::u32string u = decode(s);
  bool has_single = in_set(U'\'', u), has_double = in_set(U'"', u);
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (char32_t c : u) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (is_printable(c)) {
      kiln::utf8::append(out, c);
    } else {
      if (c <= 0xFF) {
        snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      } else if (c <= 0xFFFF) {
        snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      } else {
        snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    }
  }
  out += quote;
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

int64_t word_count(std::string_view s) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : decode(s)) {
    bool w = c == '_' || is_alnum(c) || (c >= 128 && iswalnum_l(c, utf8_locale()));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

std::vector<int64_t> slice_indices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   std::optional<int64_t> step_opt) {
  int64_t step = step_opt.value_or(1);
  int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? n : n - 1;
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  int64_t b = clamp(start, step < 0 ? upper : lower);
  int64_t e = clamp(stop, step < 0 ? lower : upper);
  std::vector<int64_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e;) {
    out.push_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;  // a step past the int range ends the slice
  }
  return out;
}

}  // namespace kiln::jinja::pystr
