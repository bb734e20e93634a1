// BPE merge loop (see bpe.h). A word is a doubly linked list of symbols; candidate merges sit in a
// min-heap ordered by (rank, position), so each merge costs O(log n) instead of a rescan of the word.
// Stale heap entries are recognised by re-checking the two symbol ids they were made from.
#include "kiln/tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>

#include "kiln/base/error.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::tokenizer {

Bpe::Bpe(TokenMap vocab, BpeOptions options, const std::string& where)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) {
    if (id < 0 || id >= kMaxTokenId) {
      fail("tokenizer", "{}: token id {} is out of range (0..{})", where, id, kMaxTokenId - 1);
    }
    max_id = std::max(max_id, id);
  }
  tokens_.resize(static_cast<size_t>(max_id + 1));
  has_token_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [tok, id] : vocab_) {
    // Two tokens with one id (hand-edited files): keep the lexicographically smaller, deterministically.
    if (!has_token_[id] || tok < tokens_[id]) tokens_[id] = tok;
    has_token_[id] = 1;
  }
  small_char_ids_.assign(0x800, -1);
  if (options_.continuing_subword_prefix.empty() && options_.end_of_word_suffix.empty()) {
    for (const auto& [tok, id] : vocab_) {
      size_t i = 0;
      if (tok.empty()) continue;
      uint32_t cp = unicode::next_char(tok, i);
      if (i == tok.size() && cp < 0x800) small_char_ids_[cp] = id;
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(std::string_view(name));
    byte_ids_[b] = options_.byte_fallback && it != vocab_.end() ? it->second : -1;
  }
  if (options_.unk_token) {
    auto it = vocab_.find(*options_.unk_token);
    if (it != vocab_.end()) unk_id_ = it->second;
  }
}

void Bpe::set_merges(const std::vector<std::pair<std::string, std::string>>& merges) {
  merges_.clear();
  merges_.reserve(merges.size());
  size_t prefix_len = options_.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end() || ib == vocab_.end()) continue;
    // With a continuing-subword prefix, the right part carries it and the merged token does not repeat it.
    std::string merged = a;
    if (prefix_len && b.compare(0, prefix_len, options_.continuing_subword_prefix) == 0) merged += b.substr(prefix_len);
    else merged += b;
    auto im = vocab_.find(merged);
    if (im == vocab_.end()) continue;
    merges_[pair_key(ia->second, ib->second)] = Merge{static_cast<int32_t>(rank), im->second};
  }
}

void Bpe::set_merges_from_ranks(const std::vector<int32_t>& ids_by_rank) {
  merges_.clear();
  for (size_t rank = 0; rank < ids_by_rank.size(); ++rank) {
    int32_t id = ids_by_rank[rank];
    const std::string* tok = id_to_token(id);
    if (!tok || tok->size() < 2) continue;
    // Every split of the token at a character boundary into two tokens is a merge with its rank.
    size_t i = 0;
    unicode::next_char(*tok, i);
    for (; i < tok->size(); i += unicode::char_len(*tok, i)) {
      auto ia = vocab_.find(std::string_view(*tok).substr(0, i));
      if (ia == vocab_.end()) continue;
      auto ib = vocab_.find(std::string_view(*tok).substr(i));
      if (ib == vocab_.end()) continue;
      merges_.emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(rank), id});
    }
  }
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size() || !has_token_[id]) return nullptr;
  return &tokens_[id];
}

int32_t Bpe::char_id(std::string_view ch) const {
  uint8_t c0 = static_cast<uint8_t>(ch[0]);
  if (ch.size() <= 2 && (c0 < 0x80 || ch.size() == 2)) {  // code points below 0x800 use the table
    size_t i = 0;
    uint32_t cp = unicode::next_char(ch, i);
    if (cp < 0x800) return small_char_ids_[cp];
  }
  auto it = vocab_.find(ch);
  return it == vocab_.end() ? -1 : it->second;
}

void Bpe::initial_symbols(std::string_view word, std::vector<int32_t>& ids) const {
  ids.clear();
  bool affixes = !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty();
  bool last_was_unk = false;
  std::string scratch;
  for (size_t i = 0; i < word.size();) {
    size_t n = unicode::char_len(word, i);
    std::string_view ch = word.substr(i, n);
    int32_t id;
    if (affixes) {
      scratch.clear();
      if (i > 0) scratch += options_.continuing_subword_prefix;
      scratch += ch;
      if (i + n == word.size()) scratch += options_.end_of_word_suffix;
      auto it = vocab_.find(std::string_view(scratch));
      id = it == vocab_.end() ? -1 : it->second;
    } else {
      id = char_id(ch);
    }
    i += n;
    if (id >= 0) {
      ids.push_back(id);
      last_was_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (char b : ch) all = all && byte_ids_[static_cast<uint8_t>(b)] >= 0;
      if (all) {
        for (char b : ch) ids.push_back(byte_ids_[static_cast<uint8_t>(b)]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(options_.fuse_unk && last_was_unk)) ids.push_back(*unk_id_);
      last_was_unk = true;
    }
    // No unk token: HF drops the character.
  }
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int32_t prev, next;  // neighbours in the list, -1 at the ends
  };
  struct Cand {
    int32_t rank, pos, left, right, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<Sym> syms;
  thread_local std::vector<Cand> heap;
  initial_symbols(word, ids);
  size_t n = ids.size();
  if (n < 2) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  syms.resize(n);
  heap.clear();
  auto push_pair = [&](int32_t pos) {
    int32_t nx = syms[pos].next;
    if (nx < 0) return;
    auto it = merges_.find(pair_key(syms[pos].id, syms[nx].id));
    if (it == merges_.end()) return;
    heap.push_back(Cand{it->second.rank, pos, syms[pos].id, syms[nx].id, it->second.id});
    std::push_heap(heap.begin(), heap.end(), std::greater<>{});
  };
  for (size_t k = 0; k < n; ++k) {
    syms[k] = Sym{ids[k], static_cast<int32_t>(k) - 1, k + 1 < n ? static_cast<int32_t>(k + 1) : -1};
  }
  for (size_t k = 0; k + 1 < n; ++k) push_pair(static_cast<int32_t>(k));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    Cand c = heap.back();
    heap.pop_back();
    Sym& left = syms[c.pos];
    // Stale when the left symbol was merged away/changed or its right neighbour changed.
    if (left.id != c.left || left.next < 0 || syms[left.next].id != c.right) continue;
    int32_t right_pos = left.next;
    left.id = c.new_id;
    left.next = syms[right_pos].next;
    if (left.next >= 0) syms[left.next].prev = c.pos;
    syms[right_pos].id = -1;  // dead
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int32_t k = 0; k >= 0; k = syms[k].next) out.push_back(syms[k].id);
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

}  // namespace kiln::tokenizer
