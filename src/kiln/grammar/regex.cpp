// Regex trees, the UTF-8 range compiler, the regex subset parser and the DFA construction (regex.h).
#include "kiln/grammar/regex.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>

#include "kiln/base/error.h"
#include "kiln/base/utf8.h"

namespace kiln::grammar {

std::string printable(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && out.size() < max; ++i) {
    uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (out.size() >= max) out += "...";
  return out;
}

// ---- trees ----

ReP re_empty() {
  static const ReP e = std::make_shared<Re>();
  return e;
}

ReP re_bytes(const ByteSet& set) {
  auto r = std::make_shared<Re>();
  r->kind = Re::Bytes;
  r->set = set;
  return r;
}

ReP re_byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return re_bytes(s);
}

ReP re_byte_range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return re_bytes(s);
}

ReP re_literal(std::string_view bytes) {
  std::vector<ReP> parts;
  for (char c : bytes) parts.push_back(re_byte(static_cast<uint8_t>(c)));
  return re_concat(std::move(parts));
}

ReP re_concat(std::vector<ReP> parts) {
  std::vector<ReP> flat;
  for (auto& p : parts) {
    if (p->kind == Re::Empty) continue;
    if (p->kind == Re::Concat) {
      flat.insert(flat.end(), p->kids.begin(), p->kids.end());
    } else {
      flat.push_back(std::move(p));
    }
  }
  if (flat.empty()) return re_empty();
  if (flat.size() == 1) return flat[0];
  auto r = std::make_shared<Re>();
  r->kind = Re::Concat;
  r->kids = std::move(flat);
  return r;
}

ReP re_alt(std::vector<ReP> parts) {
  std::vector<ReP> flat;
  for (auto& p : parts) {
    if (p->kind == Re::Alt) {
      flat.insert(flat.end(), p->kids.begin(), p->kids.end());
    } else {
      flat.push_back(std::move(p));
    }
  }
  if (flat.size() == 1) return flat[0];
  auto r = std::make_shared<Re>();
  r->kind = Re::Alt;
  r->kids = std::move(flat);
  return r;
}

ReP re_repeat(ReP r, int min, int max) {
  if (max == 0 || r->kind == Re::Empty) return re_empty();
  if (min == 1 && max == 1) return r;
  auto n = std::make_shared<Re>();
  n->kind = Re::Repeat;
  n->kids = {std::move(r)};
  n->min = min;
  n->max = max;
  return n;
}

ReP re_built(std::shared_ptr<const Dfa> dfa) {
  auto r = std::make_shared<Re>();
  r->kind = Re::Built;
  r->dfa = std::move(dfa);
  return r;
}

bool re_is_literal(const Re& r) {
  if (r.kind == Re::Bytes) return r.set.count() == 1;
  if (r.kind == Re::Concat) {
    for (const auto& k : r.kids)
      if (!re_is_literal(*k)) return false;
    return true;
  }
  return r.kind == Re::Empty;
}

// ---- code points ----

CpRanges cp_normalize(CpRanges r) {
  std::sort(r.begin(), r.end());
  CpRanges out;
  for (auto [a, b] : r) {
    if (a > b) continue;
    if (!out.empty() && a <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, b);
    } else {
      out.push_back({a, b});
    }
  }
  return out;
}

CpRanges cp_negate(const CpRanges& in) {
  CpRanges r = cp_normalize(in);
  CpRanges out;
  uint32_t next = 0;
  for (auto [a, b] : r) {
    if (a > next) out.push_back({next, a - 1});
    next = b + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

namespace {

int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_encode(uint32_t cp, uint8_t* out) {
  std::string s;
  utf8::append(s, cp);
  for (size_t i = 0; i < s.size(); ++i) out[i] = static_cast<uint8_t>(s[i]);
}

// [lo, hi] with one encoded length -> byte-range sequences (each byte position a range).
void utf8_split(uint32_t lo, uint32_t hi, std::vector<ReP>& out) {
  int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(lo, lo | m, out);
        utf8_split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(lo, (hi & ~m) - 1, out);
        utf8_split(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<ReP> seq;
  for (int i = 0; i < n; ++i) seq.push_back(re_byte_range(a[i], b[i]));
  out.push_back(re_concat(std::move(seq)));
}

}  // namespace

ReP re_codepoints(const CpRanges& in) {
  std::vector<ReP> alts;
  ByteSet ascii;
  const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (auto [a, b] : cp_normalize(in)) {
    b = std::min<uint32_t>(b, 0x10FFFF);
    // Surrogates are no characters.
    std::vector<std::pair<uint32_t, uint32_t>> parts;
    if (a < 0xD800 && b >= 0xD800) {
      parts.push_back({a, 0xD7FF});
      if (b > 0xDFFF) parts.push_back({0xE000, b});
    } else if (a >= 0xD800 && a <= 0xDFFF) {
      if (b > 0xDFFF) parts.push_back({0xE000, b});
    } else {
      parts.push_back({a, b});
    }
    for (auto [x, y] : parts) {
      for (uint32_t bound : bounds) {
        if (x > y) break;
        if (x > bound) continue;
        uint32_t end = std::min(y, bound);
        if (end < 0x80) {
          for (uint32_t c = x; c <= end; ++c) ascii.set(c);
        } else {
          utf8_split(x, end, alts);
        }
        x = end + 1;
      }
    }
  }
  if (ascii.any()) alts.insert(alts.begin(), re_bytes(ascii));
  if (alts.empty()) return re_bytes(ByteSet());  // matches nothing
  return re_alt(std::move(alts));
}

ReP re_json_codepoints(const CpRanges& in) {
  CpRanges r = cp_normalize(in);
  auto has = [&](uint32_t c) {
    for (auto [a, b] : r)
      if (a <= c && c <= b) return true;
    return false;
  };
  CpRanges plain = cp_normalize(r);
  // Remove the characters that JSON escapes.
  CpRanges special = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  CpRanges keep;
  for (auto [a, b] : plain) {
    uint32_t x = a;
    for (auto [s, e] : special) {
      if (e < x || s > b) continue;
      if (s > x) keep.push_back({x, s - 1});
      x = std::max(x, e + 1);
    }
    if (x <= b) keep.push_back({x, b});
  }
  std::vector<ReP> alts;
  if (!keep.empty()) alts.push_back(re_codepoints(keep));
  static const char* hex = "0123456789abcdef";
  auto hex_digit = [](char c) {
    ByteSet s;
    s.set(static_cast<uint8_t>(c));
    if (c >= 'a' && c <= 'f') s.set(static_cast<uint8_t>(c - 'a' + 'A'));
    return re_bytes(s);
  };
  for (uint32_t c = 0; c < 0x20; ++c) {
    if (!has(c)) continue;
    std::vector<ReP> forms;
    forms.push_back(re_concat({re_literal("\\u00"), hex_digit(hex[c >> 4]), hex_digit(hex[c & 15])}));
    const char* short_form = c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : nullptr;
    if (short_form) forms.push_back(re_literal(short_form));
    alts.push_back(re_alt(std::move(forms)));
  }
  if (has('"')) alts.push_back(re_literal("\\\""));
  if (has('\\')) alts.push_back(re_literal("\\\\"));
  if (has('/')) alts.push_back(re_literal("\\/"));
  if (alts.empty()) return re_bytes(ByteSet());
  return re_alt(std::move(alts));
}

// ---- the regex subset parser ----

namespace {

class RegexParser {
 public:
  RegexParser(std::string_view p, bool json) : p_(p), json_(json) {}

  ReP parse(bool search) {
    // Branches grouped by their anchors, so an unanchored search wraps each group once:
    // .*(a|b|c).* and not .*a.*|.*b.*|.*c.* (whose DFA tracks every word at once).
    std::vector<ReP> groups[2][2];
    while (true) {
      bool anchored_start = false, anchored_end = false;
      if (peek() == '^') {
        ++i_;
        anchored_start = true;
      }
      std::vector<ReP> seq = parse_seq(0);
      if (peek() == '$') {
        ++i_;
        anchored_end = true;
      }
      groups[anchored_start][anchored_end].push_back(re_concat(std::move(seq)));
      if (i_ >= p_.size()) break;
      if (p_[i_] == '|') {
        ++i_;
        continue;
      }
      error(p_[i_] == ')' ? "unbalanced ')'" : "an anchor (^ or $) inside the pattern");
    }
    std::vector<ReP> out;
    const ReP any = re_repeat(chars(CpRanges{{0, 0x10FFFF}}), 0, -1);
    for (int a = 0; a < 2; ++a) {
      for (int e = 0; e < 2; ++e) {
        if (groups[a][e].empty()) continue;
        std::vector<ReP> seq;
        if (search && !a) seq.push_back(any);
        seq.push_back(re_alt(std::move(groups[a][e])));
        if (search && !e) seq.push_back(any);
        out.push_back(re_concat(std::move(seq)));
      }
    }
    return re_alt(std::move(out));
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail("grammar", "regex /{}/: {} at offset {} (supported: classes, groups, alternation, quantifiers)", printable(p_),
         printable(what), i_);
  }
  int peek() const { return i_ < p_.size() ? static_cast<uint8_t>(p_[i_]) : -1; }
  uint32_t next_cp() {
    if (i_ >= p_.size()) error("unexpected end");
    return utf8::decode(p_, i_);
  }
  ReP chars(const CpRanges& r) const { return json_ ? re_json_codepoints(r) : re_codepoints(r); }

  std::vector<ReP> parse_seq(int depth) {
    if (depth > 100) error("nesting too deep");
    std::vector<ReP> seq;
    while (i_ < p_.size()) {
      char c = p_[i_];
      if (c == '|' || c == ')') break;
      if (c == '$' && (i_ + 1 == p_.size() || p_[i_ + 1] == '|')) break;
      ReP atom = parse_atom(depth);
      seq.push_back(parse_quantifiers(atom));
    }
    return seq;
  }

  ReP parse_group_body(int depth) {
    std::vector<ReP> alts;
    while (true) {
      alts.push_back(re_concat(parse_seq(depth + 1)));
      if (peek() == '|') {
        ++i_;
        continue;
      }
      if (peek() != ')') error("missing ')'");
      ++i_;
      return re_alt(std::move(alts));
    }
  }

  ReP parse_atom(int depth) {
    char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (peek() == '?') {
        ++i_;
        int k = peek();
        if (k == ':') {
          ++i_;
        } else if (k == 'P' || (k == '<' && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!')) {
          size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) error("unterminated group name");
          i_ = close + 1;
        } else {
          error("lookaround or inline flags");
        }
      }
      return parse_group_body(depth);
    }
    if (c == '[') return chars(parse_class());
    if (c == '.') {
      ++i_;
      return chars(cp_negate({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '^' || c == '$') error("an anchor (^ or $) inside the pattern");
    if (c == '*' || c == '+' || c == '?') error("a quantifier without anything to repeat");
    if (c == '\\') {
      ++i_;
      CpRanges r;
      if (parse_escape(r, false)) return chars(r);
      return chars(r);
    }
    uint32_t cp = next_cp();
    return chars({{cp, cp}});
  }

  // After '\': fills r; returns true for class escapes (\d ...).
  bool parse_escape(CpRanges& r, bool in_class) {
    if (i_ >= p_.size()) error("a trailing backslash");
    char c = p_[i_++];
    auto one = [&](uint32_t cp) {
      r.push_back({cp, cp});
      return false;
    };
    switch (c) {
      case 'd': r = {{'0', '9'}}; return true;
      case 'D': r = cp_negate({{'0', '9'}}); return true;
      case 'w': r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; return true;
      case 'W': r = cp_negate({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}); return true;
      case 's': r = space(); return true;
      case 'S': r = cp_negate(space()); return true;
      case 'n': return one('\n');
      case 't': return one('\t');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case '0': return one(0);
      case 'x': return one(hex(2));
      case 'u':
        if (peek() == '{') {
          ++i_;
          size_t close = p_.find('}', i_);
          if (close == std::string_view::npos || close == i_ || close - i_ > 6) error("bad \\u{...}");
          uint32_t v = hex(close - i_);
          ++i_;
          return one(v);
        }
        return one(hex(4));
      case 'b':
        if (in_class) return one('\b');
        error("a word boundary (\\b)");
      case 'B': error("a word boundary (\\B)");
      case 'p': case 'P': error("a Unicode property class (\\p)");
      case 'c': error("a control escape (\\c)");
      default:
        if (c >= '1' && c <= '9') error("a backreference");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) error(std::string("the escape \\") + c);
        --i_;
        return one(next_cp());
    }
  }

  static CpRanges space() {
    return cp_normalize({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                         {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
  }

  uint32_t hex(size_t n) {
    uint32_t v = 0;
    for (size_t k = 0; k < n; ++k) {
      int c = peek();
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) error("a bad hex escape");
      v = v * 16 + d;
      ++i_;
    }
    if (v > 0x10FFFF) error("a code point past U+10FFFF");
    return v;
  }

  CpRanges parse_class() {
    ++i_;  // '['
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++i_;
    }
    CpRanges r;
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) error("missing ']'");
      if (p_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      if (p_[i_] == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') error("a POSIX class");
      CpRanges item;
      bool is_class;
      if (p_[i_] == '\\') {
        ++i_;
        is_class = parse_escape(item, true);
      } else {
        uint32_t cp = next_cp();
        item = {{cp, cp}};
        is_class = false;
      }
      if (!is_class && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        CpRanges hi;
        if (p_[i_] == '\\') {
          ++i_;
          if (parse_escape(hi, true)) error("a class escape as a range end");
        } else {
          uint32_t cp = next_cp();
          hi = {{cp, cp}};
        }
        if (hi[0].first < item[0].first) error("a range out of order");
        r.push_back({item[0].first, hi[0].first});
      } else {
        r.insert(r.end(), item.begin(), item.end());
      }
    }
    return negate ? cp_negate(r) : cp_normalize(r);
  }

  ReP parse_quantifiers(ReP atom) {
    while (i_ < p_.size()) {
      char c = p_[i_];
      int min, max;
      if (c == '*') {
        min = 0, max = -1, ++i_;
      } else if (c == '+') {
        min = 1, max = -1, ++i_;
      } else if (c == '?') {
        min = 0, max = 1, ++i_;
      } else if (c == '{' && parse_braces(min, max)) {
      } else {
        break;
      }
      if (peek() == '?' || peek() == '+') ++i_;  // lazy / possessive: the same language here
      atom = re_repeat(atom, min, max);
    }
    return atom;
  }

  bool parse_braces(int& min, int& max) {
    size_t j = i_ + 1;
    auto number = [&](int& v) {
      size_t s = j;
      v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        v = v * 10 + (p_[j] - '0');
        if (v > 100000) error("a repetition count too large");
        ++j;
      }
      return j > s;
    };
    if (!number(min)) return false;
    max = min;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(max)) max = -1;
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    if (max >= 0 && max < min) error("a repetition {m,n} with n < m");
    i_ = j + 1;
    return true;
  }

  std::string_view p_;
  bool json_;
  size_t i_ = 0;
};

}  // namespace

ReP parse_regex(std::string_view pattern, bool search, bool json_string) {
  return RegexParser(pattern, json_string).parse(search);
}

// ---- DFA ----

ByteSet Dfa::first(int32_t s) const {
  ByteSet out;
  for (int b = 0; b < 256; ++b)
    if (step(s, static_cast<uint8_t>(b)) >= 0) out.set(b);
  return out;
}

void Dfa::compress_classes() {
  const int32_t n = n_states();
  std::map<std::vector<int32_t>, int> cols;
  std::vector<uint8_t> ncls(256);
  std::vector<std::vector<int32_t>> order;
  for (int b = 0; b < 256; ++b) {
    std::vector<int32_t> col(n);
    for (int32_t s = 0; s < n; ++s) col[s] = step(s, static_cast<uint8_t>(b));
    auto it = cols.find(col);
    if (it == cols.end()) {
      it = cols.emplace(col, static_cast<int>(order.size())).first;
      order.push_back(col);
    }
    ncls[b] = static_cast<uint8_t>(it->second);
  }
  std::vector<int32_t> nn(static_cast<size_t>(n) * order.size());
  for (int32_t s = 0; s < n; ++s)
    for (size_t c = 0; c < order.size(); ++c) nn[s * order.size() + c] = order[c][s];
  next = std::move(nn);
  cls = std::move(ncls);
  n_cls = static_cast<int>(order.size());
}

std::string Dfa::key() const {
  std::string k;
  k.reserve(256 + next.size() * 4 + accepting.size() + 8);
  k.append(reinterpret_cast<const char*>(cls.data()), cls.size());
  k.append(reinterpret_cast<const char*>(next.data()), next.size() * sizeof(int32_t));
  k.append(reinterpret_cast<const char*>(accepting.data()), accepting.size());
  return k;
}

namespace {

// Thompson NFA: each state has epsilon edges and at most one byte-set edge.
struct Nfa {
  struct State {
    std::vector<int32_t> eps;
    int32_t set = -1, to = -1;
  };
  std::vector<State> states;
  std::vector<ByteSet> sets;
  size_t max_states;

  int32_t add() {
    if (states.size() >= max_states) fail("grammar", "a terminal is too large (over {} NFA states); lower repetition counts", max_states);
    states.emplace_back();
    return static_cast<int32_t>(states.size() - 1);
  }
  // Returns (start, end) of a fragment for r.
  std::pair<int32_t, int32_t> build(const Re& r) {
    KILN_ASSERT(r.kind != Re::Built, "a built DFA inside a regex tree");
    switch (r.kind) {
      case Re::Built:
      case Re::Empty: {
        int32_t s = add();
        return {s, s};
      }
      case Re::Bytes: {
        int32_t a = add(), b = add();
        sets.push_back(r.set);
        states[a].set = static_cast<int32_t>(sets.size() - 1);
        states[a].to = b;
        return {a, b};
      }
      case Re::Concat: {
        auto [s, e] = build(*r.kids[0]);
        for (size_t k = 1; k < r.kids.size(); ++k) {
          auto [s2, e2] = build(*r.kids[k]);
          states[e].eps.push_back(s2);
          e = e2;
        }
        return {s, e};
      }
      case Re::Alt: {
        int32_t s = add(), e = add();
        for (const auto& k : r.kids) {
          auto [ks, ke] = build(*k);
          states[s].eps.push_back(ks);
          states[ke].eps.push_back(e);
        }
        return {s, e};
      }
      case Re::Repeat: {
        int32_t s = add(), e = s;
        for (int k = 0; k < r.min; ++k) {
          auto [ks, ke] = build(*r.kids[0]);
          states[e].eps.push_back(ks);
          e = ke;
        }
        if (r.max < 0) {
          int32_t loop = add();
          states[e].eps.push_back(loop);
          auto [ks, ke] = build(*r.kids[0]);
          states[loop].eps.push_back(ks);
          states[ke].eps.push_back(loop);
          return {s, loop};
        }
        int32_t end = add();
        for (int k = r.min; k < r.max; ++k) {
          states[e].eps.push_back(end);
          auto [ks, ke] = build(*r.kids[0]);
          states[e].eps.push_back(ks);
          e = ke;
        }
        states[e].eps.push_back(end);
        return {s, end};
      }
    }
    return {-1, -1};
  }
};

}  // namespace

Dfa compile_dfa(const Re& re, int32_t max_states) {
  Nfa nfa;
  nfa.max_states = 400000;
  auto [start, accept] = nfa.build(re);

  Dfa d;
  // Byte classes: bytes that every set treats alike share a class.
  std::vector<int> cls(256, 0);
  int n_cls = 1;
  for (const auto& set : nfa.sets) {
    std::map<std::pair<int, bool>, int> remap;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      auto k = std::make_pair(cls[b], static_cast<bool>(set[b]));
      auto it = remap.find(k);
      if (it == remap.end()) it = remap.emplace(k, n++).first;
      cls[b] = it->second;
    }
    n_cls = n;
  }
  // Renumber classes in order of first byte, so equal DFAs get equal keys.
  {
    std::vector<int> order(n_cls, -1);
    int n = 0;
    for (int b = 0; b < 256; ++b)
      if (order[cls[b]] < 0) order[cls[b]] = n++;
    for (int b = 0; b < 256; ++b) d.cls[b] = static_cast<uint8_t>(order[cls[b]]);
  }
  d.n_cls = n_cls;
  std::vector<int> rep(n_cls);
  for (int b = 255; b >= 0; --b) rep[d.cls[b]] = b;

  std::vector<uint32_t> stamp(nfa.states.size(), 0);
  uint32_t gen = 0;
  auto closure = [&](std::vector<int32_t> seed) {
    ++gen;
    std::vector<int32_t> out, stack = std::move(seed);
    while (!stack.empty()) {
      int32_t s = stack.back();
      stack.pop_back();
      if (stamp[s] == gen) continue;
      stamp[s] = gen;
      out.push_back(s);
      for (int32_t t : nfa.states[s].eps) stack.push_back(t);
    }
    std::sort(out.begin(), out.end());
    return out;
  };

  std::unordered_map<std::vector<int32_t>, int32_t, StateSetHash> ids;
  std::vector<std::vector<int32_t>> subsets;
  auto intern = [&](std::vector<int32_t> set) -> int32_t {
    if (set.empty()) return -1;
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    if (static_cast<int32_t>(subsets.size()) >= max_states)
      fail("grammar", "a terminal is too large (over {} DFA states); lower repetition counts or lengths", max_states);
    int32_t id = static_cast<int32_t>(subsets.size());
    ids.emplace(set, id);
    subsets.push_back(std::move(set));
    return id;
  };
  intern(closure({start}));
  std::vector<int32_t> next;
  for (size_t s = 0; s < subsets.size(); ++s) {
    for (int c = 0; c < n_cls; ++c) {
      uint8_t b = static_cast<uint8_t>(rep[c]);
      std::vector<int32_t> moved;
      for (int32_t q : subsets[s]) {
        const auto& st = nfa.states[q];
        if (st.set >= 0 && nfa.sets[st.set][b]) moved.push_back(st.to);
      }
      int32_t t = moved.empty() ? -1 : intern(closure(std::move(moved)));
      next.push_back(t);
    }
  }
  int32_t n = static_cast<int32_t>(subsets.size());
  std::vector<uint8_t> acc(n, 0);
  for (int32_t s = 0; s < n; ++s) acc[s] = std::binary_search(subsets[s].begin(), subsets[s].end(), accept);
  // Prune states that cannot reach acceptance (then every live state can still complete).
  std::vector<uint8_t> useful = acc;
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = 0; s < n; ++s) {
      if (useful[s]) continue;
      for (int c = 0; c < n_cls; ++c) {
        int32_t t = next[static_cast<size_t>(s) * n_cls + c];
        if (t >= 0 && useful[t]) {
          useful[s] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  // Minimize (Hopcroft): states with the same acceptance and equivalent successors merge, so "inside
  // a string" is one state whichever character came last (one cached token walk, not ten). Useless
  // states and a sink D = n form the rejecting side; blocks split by the preimages of other blocks.
  std::vector<int32_t> block(n + 1);
  {
    const int32_t N = n + 1, D = n;
    auto succ = [&](int32_t s, int c) {
      if (s == D || !useful[s]) return D;
      int32_t t = next[static_cast<size_t>(s) * n_cls + c];
      return t >= 0 && useful[t] ? t : D;
    };
    // Preimages per class: inv[c] lists, for each target, its sources (CSR).
    std::vector<std::vector<int32_t>> inv_start(n_cls, std::vector<int32_t>(N + 1, 0)), inv(n_cls, std::vector<int32_t>(N));
    for (int c = 0; c < n_cls; ++c) {
      for (int32_t s = 0; s < N; ++s) ++inv_start[c][succ(s, c) + 1];
      for (int32_t t = 0; t < N; ++t) inv_start[c][t + 1] += inv_start[c][t];
      std::vector<int32_t> fill(inv_start[c].begin(), inv_start[c].end() - 1);
      for (int32_t s = 0; s < N; ++s) inv[c][fill[succ(s, c)]++] = s;
    }
    std::vector<std::vector<int32_t>> members;
    std::vector<int32_t> accept_side, reject_side;
    for (int32_t s = 0; s < N; ++s) (s < n && useful[s] && acc[s] ? accept_side : reject_side).push_back(s);
    for (auto* side : {&accept_side, &reject_side}) {
      if (side->empty()) continue;
      for (int32_t s : *side) block[s] = static_cast<int32_t>(members.size());
      members.push_back(*side);
    }
    std::vector<std::vector<uint8_t>> in_w;
    std::vector<std::pair<int32_t, int>> work;
    for (size_t bk = 0; bk < members.size(); ++bk) {
      in_w.emplace_back(n_cls, 1);
      for (int c = 0; c < n_cls; ++c) work.push_back({static_cast<int32_t>(bk), c});
    }
    std::vector<uint32_t> mark(N, 0), touched_count;
    uint32_t gen = 0;
    std::vector<int32_t> X, touched;
    while (!work.empty()) {
      auto [A, c] = work.back();
      work.pop_back();
      in_w[A][c] = 0;
      ++gen;
      X.clear();
      for (int32_t t : members[A])
        for (int32_t k = inv_start[c][t]; k < inv_start[c][t + 1]; ++k)
          if (mark[inv[c][k]] != gen) {
            mark[inv[c][k]] = gen;
            X.push_back(inv[c][k]);
          }
      touched.clear();
      touched_count.resize(members.size(), 0);
      for (int32_t s : X) {
        int32_t bk = block[s];
        if (touched_count[bk]++ == 0) touched.push_back(bk);
      }
      for (int32_t Y : touched) {
        uint32_t cnt = touched_count[Y];
        touched_count[Y] = 0;
        if (cnt == members[Y].size()) continue;
        std::vector<int32_t> in, out;
        for (int32_t s : members[Y]) (mark[s] == gen ? in : out).push_back(s);
        int32_t Z = static_cast<int32_t>(members.size());
        members[Y] = std::move(out);
        members.push_back(std::move(in));
        touched_count.push_back(0);
        for (int32_t s : members[Z]) block[s] = Z;
        in_w.emplace_back(n_cls, 0);
        for (int cc = 0; cc < n_cls; ++cc) {
          if (in_w[Y][cc]) {
            in_w[Z][cc] = 1;
            work.push_back({Z, cc});
          } else {
            int32_t smaller = members[Z].size() <= members[Y].size() ? Z : Y;
            in_w[smaller][cc] = 1;
            work.push_back({smaller, cc});
          }
        }
      }
    }
    // The sink's block means "dead".
    for (int32_t s = 0; s < n; ++s)
      if (block[s] == block[D]) block[s] = -1;
  }
  // One representative per block (the lowest state, so the start represents its own); transitions go to them.
  std::vector<int32_t> rep_of(n + 1, -1);
  for (int32_t s = 0; s < n; ++s)
    if (useful[s] && rep_of[block[s]] < 0) rep_of[block[s]] = s;
  for (int32_t s = 0; s < n; ++s) {
    if (!useful[s]) continue;
    for (int c = 0; c < n_cls; ++c) {
      int32_t& t = next[static_cast<size_t>(s) * n_cls + c];
      if (t >= 0 && useful[t]) t = rep_of[block[t]];
    }
  }
  // Renumber useful states in BFS order from the start (state 0 stays the start).
  std::vector<int32_t> newid(n, -1), order;
  newid[0] = 0;
  order.push_back(0);
  for (size_t k = 0; k < order.size(); ++k) {
    int32_t s = order[k];
    for (int c = 0; c < n_cls; ++c) {
      int32_t t = next[static_cast<size_t>(s) * n_cls + c];
      if (t >= 0 && useful[t] && newid[t] < 0) {
        newid[t] = static_cast<int32_t>(order.size());
        order.push_back(t);
      }
    }
  }
  d.next.assign(order.size() * n_cls, -1);
  d.accepting.assign(order.size(), 0);
  d.live.assign(order.size(), 0);
  for (size_t k = 0; k < order.size(); ++k) {
    int32_t s = order[k];
    d.accepting[k] = acc[s];
    for (int c = 0; c < n_cls; ++c) {
      int32_t t = next[static_cast<size_t>(s) * n_cls + c];
      if (t >= 0 && useful[t]) {
        d.next[k * n_cls + c] = newid[t];
        d.live[k] = 1;
      }
    }
  }
  return d;
}

namespace {
void serialize(const Re& r, std::string& out) {
  out += static_cast<char>(r.kind);
  switch (r.kind) {
    case Re::Empty: break;
    case Re::Built: break;
    case Re::Bytes:
      if (r.set.count() == 1) {
        out += '\1';
        for (int b = 0; b < 256; ++b)
          if (r.set[b]) out += static_cast<char>(b);
      } else {
        out += '\0';
        for (int b = 0; b < 256; b += 8) {
          char c = 0;
          for (int k = 0; k < 8; ++k) c |= static_cast<char>(r.set[b + k] << k);
          out += c;
        }
      }
      break;
    case Re::Repeat:
      out.append(reinterpret_cast<const char*>(&r.min), sizeof(int));
      out.append(reinterpret_cast<const char*>(&r.max), sizeof(int));
      [[fallthrough]];
    case Re::Concat:
    case Re::Alt: {
      uint32_t n = static_cast<uint32_t>(r.kids.size());
      out.append(reinterpret_cast<const char*>(&n), sizeof(n));
      for (const auto& k : r.kids) serialize(*k, out);
      break;
    }
  }
}
}  // namespace

std::shared_ptr<const Dfa> cached_dfa(const Re& re) {
  if (re.kind == Re::Built) return re.dfa;
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<const Dfa>> cache;
  std::string key;
  serialize(re, key);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  auto d = std::make_shared<const Dfa>(compile_dfa(re));
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() > 20000) cache.clear();  // a bound, not a policy: schemas rarely share that much
  return cache.emplace(std::move(key), std::move(d)).first->second;
}

}  // namespace kiln::grammar
