// The BPE model: vocabulary, ranked merges, and the merge loop over one pre-tokenized word.
// Merges come either as an ordered list of pairs (tokenizer.json, merges.txt) or are derived from
// token ranks (tiktoken files, SentencePiece scores): a pair merges when its concatenation is a token,
// with that token's rank. Words are cached, so repeated words cost one hash lookup.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::tokenizer {

// Hash for heterogeneous lookup (std::string keys, std::string_view queries).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Ids must stay below this (bounds every id-indexed table, whatever a hostile file says).
constexpr int64_t kMaxTokenId = 1 << 21;

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool byte_fallback = false;  // unknown characters become <0xXX> byte tokens
  bool fuse_unk = false;       // consecutive unknown characters give one unk token
  bool ignore_merges = false;  // a word that is itself a token is emitted whole
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

class Bpe {
 public:
  // vocab: token -> id (ids in [0, kMaxTokenId)). where: the file, for error messages.
  Bpe(TokenMap vocab, BpeOptions options, const std::string& where);

  // Merges in priority order (index = rank). Pairs naming unknown tokens are skipped, as is a pair
  // whose result is not in the vocabulary; a repeated pair keeps its last rank (as HF does).
  void set_merges(const std::vector<std::pair<std::string, std::string>>& merges);
  // Derives merges from token ranks: ids_by_rank[r] is the token of rank r (lower merges first).
  void set_merges_from_ranks(const std::vector<int32_t>& ids_by_rank);

  // Appends the ids of one word (a pre-token) to out.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string of id, or nullptr for ids that are not in the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(tokens_.size()) - 1; }
  size_t n_merges() const { return merges_.size(); }
  const TokenMap& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  // Initial symbols of a word: one per character (or byte-fallback / unk tokens).
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids) const;
  int32_t char_id(std::string_view ch) const;

  TokenMap vocab_;
  std::vector<std::string> tokens_;      // id -> token; "" for ids without a token
  std::vector<uint8_t> has_token_;       // id -> 1 when the id is in the vocabulary
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<int32_t> small_char_ids_;  // code point < 0x800 -> id of that one-character token, or -1
  int32_t byte_ids_[256];                // <0xXX> token ids for byte_fallback, or -1
  std::optional<int32_t> unk_id_;
  BpeOptions options_;

  // Word cache: word -> ids. Guarded because encode() may run on several threads at once.
  static constexpr size_t kCacheCapacity = 200'000;
  static constexpr size_t kMaxCachedWord = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace kiln::tokenizer
