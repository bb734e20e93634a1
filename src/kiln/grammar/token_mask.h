// Token masks: which tokens of a vocabulary a grammar state allows next.
//
// TokenTable is the vocabulary as bytes (one per tokenizer, shared by every grammar): each token's raw
// bytes, the tokens sorted by bytes (a trie laid out flat: neighbours share prefixes, lcp[] says how
// much), and a cache of DFA walks. TokenMasker is one grammar on one table.
//
// The split (after XGrammar's adaptive token mask cache): only items that sit in a terminal scan
// bytes, so the tokens allowed by a chart are the union, over its terminal items (position, DFA
// state), of the tokens each allows. For one item most tokens are decided without its context: a
// token consumed inside the terminal is allowed, one the terminal rejects before it may end is not,
// and a token that leaves the terminal is followed through the rest of the item's rule (a sub-parse
// that does not know the parent). Only tokens that would finish the rule with bytes left over, and
// whose next byte may follow the rule somewhere (FOLLOW), stay "uncertain"; fill_mask checks just
// those against the real chart, walking them in trie order so shared prefixes are parsed once.
// Each item's classes are computed once (eagerly at state 0 of every terminal, lazily for other
// DFA states) and shared by all matchers of the grammar; the DFA part of the walk is cached on the
// table by DFA identity, so the JSON string terminal is walked once per process, not per schema.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/grammar/matcher.h"

namespace kiln::tokenizer {
class Tokenizer;
}

namespace kiln::grammar {

// A mask is one bit per token id, 32 ids per word (bit i%32 of word i/32).
using Mask = std::vector<uint32_t>;
inline bool mask_test(const uint32_t* m, int32_t id) { return (m[id >> 5] >> (id & 31)) & 1u; }
inline void mask_set(uint32_t* m, int32_t id) { m[id >> 5] |= 1u << (id & 31); }

// What one DFA state does to every token: consumed whole (accept, a bitset over ids), or left
// part-way (partial: sorted indices, with the byte offsets inside the token where the terminal may end).
struct DfaWalk {
  std::vector<uint32_t> accept;
  std::vector<int32_t> partial;
  std::vector<uint32_t> exit_begin;  // exits of partial[i]: exits[exit_begin[i], exit_begin[i+1])
  std::vector<uint16_t> exits;
};

class TokenTable {
 public:
  // Each id's bytes as the decoder emits them mid-text: byte-level BPE characters mapped back to
  // bytes, SentencePiece ▁ as a space and <0xXX> as the byte; special tokens have none (never
  // allowed), except that the stop ids (the tokenizer's EOS) are allowed once the grammar is complete.
  static std::shared_ptr<TokenTable> from_tokenizer(const tokenizer::Tokenizer& tok);
  TokenTable(std::vector<std::string> bytes, std::vector<int32_t> stop_ids);

  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  const std::vector<int32_t>& sorted() const { return sorted_; }  // ids with bytes, by bytes
  const std::vector<uint16_t>& lcp() const { return lcp_; }       // common prefix with the previous
  // Sorted indices [first, last) of the tokens whose first byte is b.
  std::pair<int32_t, int32_t> first_byte_range(uint8_t b) const { return {byte_begin_[b], byte_begin_[b + 1]}; }

  // The walk of `dfa` from `state` over the whole vocabulary, cached by (key, state).
  std::shared_ptr<const DfaWalk> dfa_walk(const Dfa& dfa, const std::string& key, int32_t state) const;
  // For each DFA state, the lowest state that no token can tell apart from it (they agree on every
  // string as long as the longest token the DFA's bytes can spell): a counted repetition's states
  // far from its bounds then share one walk. Cached by key.
  std::shared_ptr<const std::vector<int32_t>> token_classes(const Dfa& dfa, const std::string& key) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> stop_ids_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> lcp_;
  std::vector<int32_t> byte_begin_;  // 257 entries
  static constexpr size_t kMaxWalks = 4096;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const DfaWalk>> walks_;
  mutable std::unordered_map<std::string, std::shared_ptr<const std::vector<int32_t>>> classes_;
};

class TokenMasker {
 public:
  // precompute: classify every terminal position now, at all states of small terminals and the
  // start state of large ones (the rest fills in lazily, once per grammar).
  TokenMasker(std::shared_ptr<const CompiledGrammar> g, std::shared_ptr<const TokenTable> table, bool precompute = true);

  // The allowed tokens of m's state into mask (table.mask_words() words); m is restored on return.
  void fill_mask(Matcher& m, uint32_t* mask) const;
  // The same by brute force (every token tried on a copy of the state): the oracle of the tests.
  void fill_mask_brute(const Matcher& m, uint32_t* mask) const;
  // Advances m by token id (a stop id is accepted when m is complete and changes nothing).
  bool accept_token(Matcher& m, int32_t id) const;
  const TokenTable& table() const { return *table_; }
  const std::shared_ptr<const CompiledGrammar>& grammar() const { return g_; }
  size_t n_cached() const;

  // The classes of one terminal item (exposed for tests and the bench).
  struct Entry {
    std::vector<std::shared_ptr<const DfaWalk>> walks;  // their accept bitsets are allowed
    std::vector<int32_t> accept;                         // more allowed ids
    std::vector<int32_t> uncertain;                      // sorted indices to check against the chart
  };
  std::shared_ptr<const Entry> entry(int32_t pos, int32_t state) const;

 private:
  std::shared_ptr<Entry> compute(int32_t pos, int32_t state) const;
  int tail(Chart& c, int32_t q, std::string_view bytes) const;
  void walk_from(int32_t q, std::vector<int32_t>& accept, std::vector<int32_t>& uncertain) const;

  static constexpr int32_t kEagerStates = 24;  // terminals this small are classified whole up front
  std::shared_ptr<const CompiledGrammar> g_;
  std::shared_ptr<const TokenTable> table_;
  std::vector<std::string> keys_;  // per terminal: its DFA's key
  std::vector<std::shared_ptr<const std::vector<int32_t>>> classes_;  // per terminal: TokenTable::token_classes
  mutable std::mutex mu_;
  mutable std::unordered_map<uint64_t, std::shared_ptr<const Entry>> entries_;
};

}  // namespace kiln::grammar
