// Regular expressions over bytes: the terminals of every grammar. A tree (Re) built by the grammar
// sources (GBNF literals and classes, JSON Schema strings/numbers/patterns, the `regex` source),
// compiled to a byte DFA (Thompson NFA, subset construction, byte classes, dead states pruned).
// Code point classes become UTF-8 byte sequences here, so a token that ends inside a multi-byte
// character simply leaves the DFA between two of its bytes.
#pragma once
#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::grammar {

using ByteSet = std::bitset<256>;

struct Re;
using ReP = std::shared_ptr<const Re>;

struct Dfa;

// One node. Empty matches "", Bytes one byte of `set`, Repeat kids[0] between min and max times
// (max -1: unbounded). Built: a DFA made directly (only as a whole terminal, never inside a tree).
struct Re {
  enum Kind : uint8_t { Empty, Bytes, Concat, Alt, Repeat, Built };
  Kind kind = Empty;
  ByteSet set;
  std::vector<ReP> kids;
  int min = 0, max = -1;
  std::shared_ptr<const Dfa> dfa;
};

// s for an error message: control bytes as \xHH, at most max bytes (errors are one line).
std::string printable(std::string_view s, size_t max = 200);

ReP re_empty();
ReP re_bytes(const ByteSet& set);
ReP re_byte(uint8_t b);
ReP re_byte_range(uint8_t lo, uint8_t hi);
ReP re_literal(std::string_view bytes);
ReP re_concat(std::vector<ReP> parts);
ReP re_alt(std::vector<ReP> parts);
ReP re_repeat(ReP r, int min, int max);
// True when r matches exactly one fixed byte string (a literal): adjacent literals are merged.
bool re_is_literal(const Re& r);

// Sets of code points as sorted, disjoint, inclusive ranges.
using CpRanges = std::vector<std::pair<uint32_t, uint32_t>>;
CpRanges cp_normalize(CpRanges r);
CpRanges cp_negate(const CpRanges& r);  // within [0, 0x10FFFF], surrogates excluded
// The UTF-8 encodings of the code points in r (surrogates never match).
ReP re_codepoints(const CpRanges& r);
// The same code points as they appear inside a JSON string: '"', '\\' and control characters by
// their escapes (\" \\ \n \t ... \u00XX), everything else as raw UTF-8.
ReP re_json_codepoints(const CpRanges& r);

// A regex subset: literals, classes ([a-z], [^...], \d \w \s and negations, .), groups ((...), (?:...),
// named groups), alternation, quantifiers (* + ? {m} {m,} {m,n}, lazy forms read as greedy). `^` and `$`
// are accepted at the ends of top-level alternatives. search = JSON Schema `pattern` semantics (an
// unanchored end matches anything around the match); otherwise the whole input must match. json_string:
// the result describes the string's JSON-escaped bytes (between the quotes). Throws kiln::Error
// "[grammar] regex /.../: ..." naming what it cannot handle (backreferences, lookaround, ...).
ReP parse_regex(std::string_view pattern, bool search, bool json_string);

// A byte DFA. State 0 is the start; next is -1 for dead transitions. Byte b moves through its class
// (cls[b]), so a state's row is n_cls wide.
// FNV-1a over a set of state ids: the key of maps from state sets (subset construction, minimization).
struct StateSetHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ULL;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ULL;
    return h;
  }
};

struct Dfa {
  std::vector<uint8_t> cls = std::vector<uint8_t>(256, 0);
  int n_cls = 1;
  std::vector<int32_t> next;
  std::vector<uint8_t> accepting;
  std::vector<uint8_t> live;  // the state has at least one outgoing transition
  int32_t n_states() const { return static_cast<int32_t>(accepting.size()); }
  int32_t step(int32_t s, uint8_t b) const { return next[static_cast<size_t>(s) * n_cls + cls[b]]; }
  ByteSet first(int32_t s) const;  // bytes with a transition out of s
  // Identity for caches shared across grammars (two DFAs with equal keys behave the same).
  std::string key() const;
  // Regroups bytes into classes by their columns (for DFAs built with one class per byte).
  void compress_classes();
};
ReP re_built(std::shared_ptr<const Dfa> dfa);

// Throws kiln::Error "[grammar] ... too large" past max_states (counted repetitions blow up).
Dfa compile_dfa(const Re& re, int32_t max_states = 20000);
// compile_dfa through a process-wide cache keyed by the tree's structure: the same terminals
// (strings, numbers, keys) recur across schemas.
std::shared_ptr<const Dfa> cached_dfa(const Re& re);

}  // namespace kiln::grammar
