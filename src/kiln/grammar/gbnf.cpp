// GBNF (llama.cpp's grammar format) -> Grammar, and the whole-output regex source.
// Whitespace and # comments separate elements; a newline ends a rule's body except inside
// parentheses or right after `::=` / `|` (as llama.cpp reads it). Regular pieces (literals,
// classes, groups and repetitions of them) become terminals; rule references stay rules and
// their repetitions become left-recursive helper rules.
#include <cctype>
#include <map>

#include "kiln/base/error.h"
#include "kiln/base/utf8.h"
#include "kiln/grammar/grammar.h"

namespace kiln::grammar {

namespace {

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view s) : s_(s) {}

  Grammar parse() {
    skip_space(true);
    while (i_ < s_.size()) {
      std::string name = parse_name();
      skip_space(false);
      if (s_.compare(i_, 3, "::=") != 0) error("expected ::= after rule name " + name);
      i_ += 3;
      skip_space(true);
      int32_t r = rule_id(name);
      if (defined_[r]) error("rule " + name + " is defined twice");
      defined_[r] = 1;
      auto alts = parse_alternates(false, 0);
      for (auto& seq : alts) g_.rules[r].alts.push_back(to_syms(seq));
      if (i_ < s_.size()) {
        if (s_[i_] == '\r') ++i_;
        if (i_ < s_.size() && s_[i_] != '\n') error("expected the end of the line");
      }
      skip_space(true);
    }
    for (auto& [name, id] : ids_)
      if (!defined_[id]) fail("grammar", "gbnf: rule {} is used but never defined", name);
    auto root = ids_.find("root");
    if (root == ids_.end()) fail("grammar", "gbnf: no root rule (the start rule is `root ::= ...`)");
    g_.start = root->second;
    return std::move(g_);
  }

 private:
  struct Elem {
    ReP re;            // a regular piece
    int32_t rule = -1;  // or a rule
  };
  using Seq = std::vector<Elem>;

  [[noreturn]] void error(const std::string& what) const {
    size_t line = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) line += s_[k] == '\n';
    fail("grammar", "gbnf: {} (line {})", printable(what), line);
  }

  int32_t rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    int32_t id = g_.add_rule(name);
    ids_.emplace(name, id);
    defined_.push_back(0);
    return id;
  }
  int32_t helper_rule(const std::string& base) {
    int32_t id = g_.add_rule(base + "_" + std::to_string(g_.rules.size()));
    defined_.push_back(1);
    return id;
  }

  static bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }

  void skip_space(bool newlines) {
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && newlines)) {
        ++i_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    size_t b = i_;
    while (i_ < s_.size() && word_char(s_[i_])) ++i_;
    if (i_ == b) error("expected a rule name");
    return std::string(s_.substr(b, i_ - b));
  }

  uint32_t parse_char() {
    if (i_ >= s_.size()) error("unexpected end of input");
    if (s_[i_] != '\\') return utf8::decode(s_, i_);
    ++i_;
    if (i_ >= s_.size()) error("unexpected end of input after a backslash");
    char c = s_[i_++];
    auto hex = [&](int n) {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) error("a bad hex escape");
        char h = s_[i_++];
        v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      return v;
    };
    switch (c) {
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case 't': return '\t';
      case 'r': return '\r';
      case 'n': return '\n';
      case '\\': case '"': case '[': case ']': case '-': case '^': return static_cast<uint8_t>(c);
      default: error(std::string("an unknown escape \\") + c);
    }
  }

  std::vector<Seq> parse_alternates(bool nested, int depth) {
    if (depth > 64) error("nesting too deep");
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(nested, depth));
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      skip_space(true);
      alts.push_back(parse_sequence(nested, depth));
    }
    return alts;
  }

  Seq parse_sequence(bool nested, int depth) {
    Seq seq;
    while (i_ < s_.size()) {
      char c = s_[i_];
      Elem e;
      if (c == '"') {
        ++i_;
        std::string lit;
        while (true) {
          if (i_ >= s_.size()) error("an unterminated literal");
          if (s_[i_] == '"') {
            ++i_;
            break;
          }
          utf8::append(lit, parse_char());
        }
        e.re = re_literal(lit);
      } else if (c == '[') {
        ++i_;
        bool neg = false;
        if (i_ < s_.size() && s_[i_] == '^') {
          neg = true;
          ++i_;
        }
        CpRanges r;
        while (true) {
          if (i_ >= s_.size()) error("an unterminated character class");
          if (s_[i_] == ']') {
            ++i_;
            break;
          }
          uint32_t lo = parse_char(), hi = lo;
          if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
            ++i_;
            hi = parse_char();
          }
          if (hi < lo) error("a character range out of order");
          r.push_back({lo, hi});
        }
        e.re = re_codepoints(neg ? cp_negate(r) : cp_normalize(r));
      } else if (c == '.') {
        ++i_;
        e.re = re_codepoints({{0, 0x10FFFF}});
      } else if (c == '(') {
        ++i_;
        skip_space(true);
        auto alts = parse_alternates(true, depth + 1);
        if (i_ >= s_.size() || s_[i_] != ')') error("expected )");
        ++i_;
        e = group(alts);
      } else if (word_char(c)) {
        size_t save = i_;
        std::string name = parse_name();
        skip_space(false);
        if (s_.compare(i_, 3, "::=") == 0) {  // the next rule begins (a body ended without newline)
          i_ = save;
          return seq;
        }
        i_ = save;
        parse_name();
        e.rule = rule_id(name);
      } else {
        break;  // '|', ')', newline, end
      }
      skip_space(nested);
      // Repetitions.
      while (i_ < s_.size()) {
        char q = s_[i_];
        int min, max;
        if (q == '*') {
          min = 0, max = -1, ++i_;
        } else if (q == '+') {
          min = 1, max = -1, ++i_;
        } else if (q == '?') {
          min = 0, max = 1, ++i_;
        } else if (q == '{') {
          ++i_;
          skip_space(nested);
          min = parse_int();
          max = min;
          skip_space(nested);
          if (i_ < s_.size() && s_[i_] == ',') {
            ++i_;
            skip_space(nested);
            max = (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ? parse_int() : -1;
            skip_space(nested);
          }
          if (i_ >= s_.size() || s_[i_] != '}') error("expected } after a repetition count");
          ++i_;
          if (max >= 0 && max < min) error("a repetition {m,n} with n < m");
        } else {
          break;
        }
        e = repeat(e, min, max);
        skip_space(nested);
      }
      seq.push_back(std::move(e));
    }
    return seq;
  }

  int parse_int() {
    size_t b = i_;
    long v = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      v = v * 10 + (s_[i_++] - '0');
      if (v > 10000) error("a repetition count over 10000");
    }
    if (i_ == b) error("expected a number");
    return static_cast<int>(v);
  }

  std::vector<Sym> to_syms(const Seq& seq) {
    std::vector<Sym> out;
    std::vector<ReP> run;
    auto flush = [&] {
      if (!run.empty()) out.push_back(g_.term(re_concat(std::move(run))));
      run.clear();
    };
    for (const Elem& e : seq) {
      if (e.re) {
        run.push_back(e.re);
      } else {
        flush();
        out.push_back(Grammar::rule_sym(e.rule));
      }
    }
    flush();
    return out;
  }

  Elem group(const std::vector<Seq>& alts) {
    bool regular = true;
    for (const auto& seq : alts)
      for (const auto& e : seq) regular = regular && e.re != nullptr;
    if (regular) {
      std::vector<ReP> parts;
      for (const auto& seq : alts) {
        std::vector<ReP> cat;
        for (const auto& e : seq) cat.push_back(e.re);
        parts.push_back(re_concat(std::move(cat)));
      }
      return Elem{re_alt(std::move(parts)), -1};
    }
    int32_t r = helper_rule("group");
    for (const auto& seq : alts) g_.rules[r].alts.push_back(to_syms(seq));
    return Elem{nullptr, r};
  }

  Elem repeat(const Elem& e, int min, int max) {
    if (e.re) return Elem{re_repeat(e.re, min, max), -1};
    Sym x = Grammar::rule_sym(e.rule);
    const std::string base = g_.rules[e.rule].name;  // a copy: add_rule may move the rules
    // Unbounded tail: T ::= T x | "" (left recursive).
    auto star = [&] {
      int32_t t = helper_rule(base + "_star");
      g_.rules[t].alts = {{Grammar::rule_sym(t), x}, {}};
      return t;
    };
    int32_t r = helper_rule(base + "_rep");
    std::vector<Sym> body(static_cast<size_t>(min), x);
    if (max < 0) {
      body.push_back(Grammar::rule_sym(star()));
    } else if (max > min) {
      // (x (x (...)?)?)? for the optional copies.
      int32_t opt = -1;
      for (int k = 0; k < max - min; ++k) {
        int32_t o = helper_rule(base + "_opt");
        std::vector<Sym> alt{x};
        if (opt >= 0) alt.push_back(Grammar::rule_sym(opt));
        g_.rules[o].alts = {alt, {}};
        opt = o;
      }
      body.push_back(Grammar::rule_sym(opt));
    }
    g_.rules[r].alts = {body};
    return Elem{nullptr, r};
  }

  std::string_view s_;
  size_t i_ = 0;
  Grammar g_;
  std::map<std::string, int32_t> ids_;
  std::vector<uint8_t> defined_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text) { return GbnfParser(text).parse(); }

Grammar regex_grammar(std::string_view pattern) {
  Grammar g;
  g.start = g.add_rule("root");
  g.rules[0].alts = {{g.term(parse_regex(pattern, /*search=*/false, /*json_string=*/false))}};
  return g;
}

}  // namespace kiln::grammar
