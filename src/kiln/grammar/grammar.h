// The grammar IR and its compiled form. A grammar is context-free over bytes: rules with
// alternatives, each a sequence of symbols; a symbol is another rule or a terminal, and every
// terminal is a regular expression over bytes (regex.h) compiled to a DFA. Keeping lexeme-like
// pieces (a whole JSON string, a number, a literal run such as `,"name":`) as one terminal keeps the
// Earley sets small and lets token masks be precomputed per DFA state (token_mask.h).
//
// Sources: parse_gbnf (llama.cpp's GBNF), regex_grammar (a whole-output regex), json_schema.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/grammar/regex.h"

namespace kiln::grammar {

struct Sym {
  enum Kind : uint8_t { Term, Rule };
  Kind kind;
  int32_t id;  // index into Grammar::terms or Grammar::rules
};

struct Rule {
  std::string name;
  std::vector<std::vector<Sym>> alts;  // an empty alternative matches ""
};

struct Grammar {
  std::vector<Rule> rules;
  std::vector<ReP> terms;
  int32_t start = 0;

  int32_t add_rule(std::string name);
  Sym term(ReP re);
  static Sym rule_sym(int32_t id) { return Sym{Sym::Rule, id}; }
  std::string dump() const;  // readable text, for tests and errors
};

// GBNF (llama.cpp's grammar format): `name ::= ...` rules, "literals", [classes], (groups), `.`,
// * + ? {m} {m,} {m,n}, # comments; the start rule is `root`. Errors are kiln::Error "[grammar] gbnf: ...".
Grammar parse_gbnf(std::string_view text);
// A grammar whose language is exactly the regex (anchors implied).
Grammar regex_grammar(std::string_view pattern);

// The flat, immutable form the matcher runs on. Positions: every alternative is laid out as its
// symbols followed by an End marker; an Earley item is a position plus an origin (and a DFA state
// while it sits in a terminal).
class CompiledGrammar {
 public:
  // Merges adjacent literal terminals, drops unproductive alternatives, adds the start rule
  // S' -> S, computes nullability and FIRST/FOLLOW byte sets. Throws when the grammar matches nothing.
  explicit CompiledGrammar(const Grammar& g);

  enum Kind : uint8_t { Term, Rule, End };
  struct Pos {
    Kind kind;
    int32_t id;   // term, rule, or for End the rule this alternative belongs to
    int32_t lhs;  // the rule of this alternative
  };
  const std::vector<Pos>& pos() const { return pos_; }
  const std::vector<int32_t>& alts(int32_t rule) const { return alts_[rule]; }
  const Dfa& dfa(int32_t term) const { return *dfas_[term]; }
  int32_t n_terms() const { return static_cast<int32_t>(dfas_.size()); }
  int32_t n_rules() const { return static_cast<int32_t>(alts_.size()); }
  bool rule_nullable(int32_t r) const { return nullable_[r]; }
  int32_t start_rule() const { return start_; }  // the added S'
  // Bytes that may follow a complete `rule` anywhere (eos: it may end the input).
  const ByteSet& follow(int32_t rule) const { return follow_[rule]; }
  bool follow_eos(int32_t rule) const { return follow_eos_[rule]; }
  // Bytes that may come next from position p on (its suffix, then the rule's follow when nullable).
  const ByteSet& first_from(int32_t p) const { return first_from_[p]; }
  const std::string& rule_name(int32_t r) const { return names_[r]; }
  size_t n_positions() const { return pos_.size(); }

 private:
  std::vector<Pos> pos_;
  std::vector<std::vector<int32_t>> alts_;
  std::vector<std::shared_ptr<const Dfa>> dfas_;
  std::vector<uint8_t> nullable_;
  std::vector<ByteSet> follow_, first_from_;
  std::vector<uint8_t> follow_eos_;
  std::vector<std::string> names_;
  int32_t start_ = 0;
};

}  // namespace kiln::grammar
