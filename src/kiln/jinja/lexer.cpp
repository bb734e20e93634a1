// Jinja lexer (see lexer.h). It follows jinja2's lexer state machine: the root state scans
// for the first `{{`, `{%` or `{#`; tag states read expression tokens until their end delimiter
// (only while brackets are balanced, so `{{ {'a': 1} }}` works).
#include "kiln/jinja/lexer.h"

#include <algorithm>

#include "kiln/base/error.h"
#include "kiln/base/utf8.h"
#include "kiln/jinja/strings.h"

namespace kiln::jinja {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(unsigned char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
bool is_name_char(unsigned char c) { return is_name_start(c) || is_digit(static_cast<char>(c)); }

// Python's rstrip() on UTF-8 (Unicode whitespace).
std::string rstrip_ws(std::string_view s) { return pystr::strip(s, nullptr, false, true); }

class Lexer {
 public:
  Lexer(std::string src, const LexerOptions& opt) : src_(std::move(src)), opt_(opt) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t p = find_tag(pos);
      if (p == std::string::npos) {
        emit(TokenType::Data, src_.substr(pos), pos);
        break;
      }
      char kind = src_[p + 1];
      std::string text = src_.substr(pos, p - pos);
      size_t raw_end = kind == '%' ? match_raw_begin(p) : 0;
      size_t q = p + 2;
      char sign = 0;
      if (raw_end) {
        sign = (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      } else if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) {
        sign = src_[q++];
      }
      emit(TokenType::Data, strip_before_tag(text, sign, kind != '{', line_starting), pos);
      if (raw_end) {
        pos = lex_raw(raw_end, line_starting);
        continue;
      }
      if (kind == '#') {
        pos = skip_comment(q, p, line_starting);
      } else {
        emit(kind == '{' ? TokenType::VarBegin : TokenType::BlockBegin, "", p);
        pos = lex_tag(q, kind == '%', line_starting);
      }
    }
    tokens_.push_back({TokenType::Eof, "", line_of(src_.size())});
    return std::move(tokens_);
  }

 private:
  int line_of(size_t pos) const {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) - line_starts_.begin());
  }

  [[noreturn]] void fail_at(size_t pos, const std::string& msg) const {
    kiln::fail("template", "line {}: {}", line_of(pos), msg);
  }

  void emit(TokenType t, std::string value, size_t pos) {
    if (t == TokenType::Data && value.empty()) return;
    tokens_.push_back({t, std::move(value), line_of(pos)});
  }

  size_t find_tag(size_t pos) const {
    for (size_t p = src_.find('{', pos); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  size_t skip_space(size_t i) const {
    while (i < src_.size()) {
      size_t j = i;
      uint32_t c = kiln::utf8::decode(src_, j);
      if (!pystr::is_space(c)) break;
      i = j;
    }
    return i;
  }

  bool at(size_t i, std::string_view s) const { return src_.compare(i, s.size(), s) == 0; }

  // `{%` [-+]? \s* raw \s* (`-%}` \s* | `%}`): the end of the match, or 0 when not a raw tag.
  size_t match_raw_begin(size_t p) const {
    size_t i = p + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i = skip_space(i);
    if (!at(i, "raw")) return 0;
    i = skip_space(i + 3);
    if (at(i, "-%}")) return skip_space(i + 3);
    if (at(i, "%}")) return i + 2;
    return 0;
  }

  // The text before a tag: `-` strips all trailing whitespace; otherwise lstrip_blocks drops
  // spaces/tabs between the line start and a block or comment tag.
  std::string strip_before_tag(const std::string& text, char sign, bool lstrip_kind, bool line_starting) const {
    if (sign == '-') return rstrip_ws(text);
    if (sign != '+' && opt_.lstrip_blocks && lstrip_kind) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        if (text.find_first_not_of(" \t", l_pos) == std::string::npos) return text.substr(0, l_pos);
      }
    }
    return text;
  }

  // The end of the `%}`, `#}` or `}}` (kind '%', '#', '{') that closes a tag at i, or 0 when none is
  // there: `-` strips the whitespace after it; trim_blocks drops one newline after a block or
  // comment, `+` keeps it (a print tag has neither).
  size_t close_at(size_t i, char kind) const {
    const bool print = kind == '{';
    const std::string close{print ? '}' : kind, '}'};
    if (!print && at(i, "+" + close)) return i + 3;
    if (at(i, "-" + close)) return skip_space(i + 3);
    if (!at(i, close)) return 0;
    const bool trim = !print && opt_.trim_blocks && i + 2 < src_.size() && src_[i + 2] == '\n';
    return trim ? i + 3 : i + 2;
  }

  // After `{% raw %}`: the text up to `{% endraw %}` is data.
  size_t lex_raw(size_t start, bool& line_starting) {
    bool begin_ends_line = start > 0 && src_[start - 1] == '\n';
    for (size_t p = src_.find("{%", start); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t i = p + 2;
      char sign = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) sign = src_[i++];
      i = skip_space(i);
      if (!at(i, "endraw")) continue;
      size_t end = close_at(skip_space(i + 6), '%');
      if (!end) continue;
      emit(TokenType::Data, strip_before_tag(src_.substr(start, p - start), sign, true, begin_ends_line), start);
      line_starting = src_[end - 1] == '\n';
      return end;
    }
    fail_at(start, "Missing end of raw directive");
  }

  size_t skip_comment(size_t i, size_t begin, bool& line_starting) {
    for (; i < src_.size(); ++i) {
      if (size_t end = close_at(i, '#')) {
        line_starting = src_[end - 1] == '\n';
        return end;
      }
    }
    fail_at(begin, "Missing end of comment tag");
  }

  // Expression tokens until the tag's end delimiter. Returns the position after it.
  size_t lex_tag(size_t i, bool block, bool& line_starting) {
    std::vector<char> balance;
    line_starting = false;
    while (i < src_.size()) {
      if (size_t end = balance.empty() ? close_at(i, block ? '%' : '{') : 0) {
        emit(block ? TokenType::BlockEnd : TokenType::VarEnd, "", i);
        line_starting = src_[end - 1] == '\n';
        return end;
      }
      size_t j = skip_space(i);
      if (j != i) {
        i = j;
        continue;
      }
      char c = src_[i];
      if (is_digit(c)) {
        i = lex_number(i);
      } else if (is_name_start(static_cast<unsigned char>(c))) {
        j = i;
        while (j < src_.size() && is_name_char(static_cast<unsigned char>(src_[j]))) ++j;
        emit(TokenType::Name, src_.substr(i, j - i), i);
        i = j;
      } else if (c == '\'' || c == '"') {
        i = lex_string(i);
      } else {
        i = lex_operator(i, balance);
      }
    }
    return i;  // end of source inside a tag: the parser reports it
  }

  size_t digits(size_t i, std::string& out) const {
    // (\d+_)*\d+ ; returns i unchanged when no digit
    size_t j = i;
    while (j < src_.size() && is_digit(src_[j])) {
      while (j < src_.size() && is_digit(src_[j])) out += src_[j++];
      if (j + 1 < src_.size() && src_[j] == '_' && is_digit(src_[j + 1])) ++j;
    }
    return j;
  }

  size_t lex_number(size_t i) {
    std::string text;
    size_t j = digits(i, text);
    bool after_dot = i > 0 && src_[i - 1] == '.';
    if (!after_dot) {
      // float: digits (.digits)? e[+-]?digits | digits .digits
      std::string f = text;
      size_t k = j;
      bool has_frac = false;
      if (k + 1 < src_.size() && src_[k] == '.' && is_digit(src_[k + 1])) {
        f += '.';
        k = digits(k + 1, f);
        has_frac = true;
      }
      size_t e = k;
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        std::string ex = "e";
        size_t m = e + 1;
        if (m < src_.size() && (src_[m] == '+' || src_[m] == '-')) ex += src_[m++];
        if (m < src_.size() && is_digit(src_[m])) {
          m = digits(m, ex);
          emit(TokenType::Float, f + ex, i);
          return m;
        }
      }
      if (has_frac) {
        emit(TokenType::Float, f, i);
        return k;
      }
    }
    emit(TokenType::Integer, text, i);
    return j;
  }

  size_t lex_string(size_t i) {
    char quote = src_[i];
    size_t j = i + 1;
    while (j < src_.size() && src_[j] != quote) {
      if (src_[j] == '\\') ++j;
      ++j;
    }
    if (j >= src_.size()) fail_at(i, fmt::format("unexpected char {} at {}", pystr::repr(std::string(1, quote)), i));
    emit(TokenType::String, decode_string_literal(std::string_view(src_).substr(i + 1, j - i - 1), line_of(i)), i);
    return j + 1;
  }

  size_t lex_operator(size_t i, std::vector<char>& balance) {
    static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (at(i, op)) {
        emit(TokenType::Op, op, i);
        return i + 2;
      }
    }
    char c = src_[i];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      size_t j = i;
      uint32_t cp = kiln::utf8::decode(src_, j);
      fail_at(i, fmt::format("unexpected char {} at {}", pystr::repr(pystr::encode(std::u32string(1, cp))), i));
    }
    if (c == '{' || c == '(' || c == '[') {
      balance.push_back(c == '{' ? '}' : c == '(' ? ')' : ']');
    } else if (c == '}' || c == ')' || c == ']') {
      if (balance.empty()) fail_at(i, fmt::format("unexpected '{}'", c));
      char want = balance.back();
      balance.pop_back();
      if (want != c) fail_at(i, fmt::format("unexpected '{}', expected '{}'", c, want));
    }
    emit(TokenType::Op, std::string(1, c), i);
    return i + 1;
  }

  std::string src_;
  LexerOptions opt_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

// \r\n and \r become \n; one final newline is dropped unless kept.
std::string normalize_newlines(std::string_view s, bool keep_trailing_newline) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string decode_string_literal(std::string_view body, int line) {
  std::string out;
  out.reserve(body.size());
  size_t i = 0;
  while (i < body.size()) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      ++i;
      continue;
    }
    char e = body[i + 1];
    i += 2;
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          int h = i + k < body.size() ? hex_value(body[i + k]) : -1;
          if (h < 0) {
            kiln::fail("template", "line {}: (unicode error) 'unicodeescape' codec can't decode bytes: truncated \\{}{} escape",
                       line, e, std::string(n, 'X'));
          }
          cp = cp * 16 + static_cast<uint32_t>(h);
        }
        if (cp > 0x10FFFF) kiln::fail("template", "line {}: illegal Unicode character in string literal", line);
        i += n;
        kiln::utf8::append(out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k) cp = cp * 8 + (body[i++] - '0');
          kiln::utf8::append(out, cp);
        } else if (e == 'N') {
          kiln::fail("template", "line {}: unsupported \\N{{...}} escape in a string literal", line);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(normalize_newlines(source, options.keep_trailing_newline), options).run();
}

}  // namespace kiln::jinja
