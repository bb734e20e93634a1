// Added-token matching (see added_vocab.h). HF uses an Aho-Corasick automaton with leftmost-longest
// semantics; a byte trie walked from each candidate position gives the same matches, and a first-byte
// filter keeps the scan cheap on text that has no token-initial bytes.
#include "kiln/tokenizer/added_vocab.h"

#include <algorithm>

#include "kiln/tokenizer/normalizer.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::tokenizer {

void AddedVocab::Trie::insert(std::string_view key, int32_t token_index) {
  if (key.empty()) return;
  int32_t node = 0;
  for (char c : key) {
    uint64_t k = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    auto it = edges.find(k);
    if (it == edges.end()) {
      int32_t child = static_cast<int32_t>(terminal.size());
      terminal.push_back(-1);
      it = edges.emplace(k, child).first;
    }
    node = it->second;
  }
  if (terminal[node] < 0) terminal[node] = token_index;
  first_byte[static_cast<uint8_t>(key[0])] = true;
}

std::pair<int32_t, size_t> AddedVocab::Trie::longest(std::string_view s, size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    auto it = edges.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(s[i]));
    if (it == edges.end()) break;
    node = it->second;
    if (terminal[node] >= 0) best = {terminal[node], i + 1 - pos};
  }
  return best;
}

void AddedVocab::add(const AddedToken& t) {
  if (by_content_.count(t.content) || by_id_.count(t.id)) return;
  by_id_[t.id] = static_cast<int32_t>(tokens_.size());
  by_content_[t.content] = t.id;
  tokens_.push_back(t);
}

void AddedVocab::build(const Normalizer* normalizer) {
  raw_ = Trie();
  normalized_ = Trie();
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const AddedToken& t = tokens_[k];
    if (!t.normalized) {
      raw_.insert(t.content, static_cast<int32_t>(k));
      continue;
    }
    std::string content = t.content;
    if (normalizer) normalizer->normalize(content);
    normalized_.insert(content, static_cast<int32_t>(k));
  }
}

const AddedToken* AddedVocab::by_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocab::by_content(std::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

int32_t AddedVocab::max_id() const {
  int32_t m = -1;
  for (const auto& t : tokens_) m = std::max(m, t.id);
  return m;
}

namespace {
// The code point that ends s[0..end) (s valid UTF-8), or -1 at the start.
int64_t char_before(std::string_view s, size_t end) {
  if (end == 0) return -1;
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return unicode::next_char(s, start);
}
bool is_word_char(int64_t cp) { return cp >= 0 && (cp == '_' || unicode::is_alphanumeric(static_cast<uint32_t>(cp))); }
}  // namespace

void AddedVocab::split(std::string_view s, bool normalized, std::vector<Segment>& out) const {
  const Trie& trie = normalized ? normalized_ : raw_;
  size_t done = 0;  // s[0..done) is already covered by segments
  if (!trie.empty()) {
    for (size_t i = 0; i < s.size();) {
      if (!trie.first_byte[static_cast<uint8_t>(s[i])]) {
        ++i;
        continue;
      }
      auto [index, len] = trie.longest(s, i);
      if (index < 0) {
        ++i;
        continue;
      }
      const AddedToken& t = tokens_[index];
      size_t start = i, stop = i + len;
      i = stop;  // like Aho-Corasick's non-overlapping iteration, a rejected match is not retried shorter
      if (t.single_word) {
        size_t after = stop;
        bool word_before = is_word_char(char_before(s, start));
        bool word_after = after < s.size() && is_word_char(unicode::next_char(s, after));
        if (word_before || word_after) continue;
      }
      if (t.lstrip) {
        while (start > done) {
          size_t prev = start - 1;
          while (prev > done && (static_cast<uint8_t>(s[prev]) & 0xC0) == 0x80) --prev;
          size_t k = prev;
          if (!unicode::is_whitespace(unicode::next_char(s, k))) break;
          start = prev;
        }
      }
      if (t.rstrip) {
        while (stop < s.size()) {
          size_t k = stop;
          if (!unicode::is_whitespace(unicode::next_char(s, k))) break;
          stop = k;
        }
        i = stop;
      }
      if (done < start) out.push_back({done, start, -1});
      out.push_back({start, stop, t.id});
      done = stop;
    }
  }
  if (done < s.size() || s.empty()) out.push_back({done, s.size(), -1});
}

}  // namespace kiln::tokenizer
