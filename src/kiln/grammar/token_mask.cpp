// TokenTable and TokenMasker (token_mask.h).
#include "kiln/grammar/token_mask.h"

#include <algorithm>
#include <numeric>

#include "kiln/base/error.h"
#include "kiln/tokenizer/tokenizer.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::grammar {

// ---- TokenTable ----

std::shared_ptr<TokenTable> TokenTable::from_tokenizer(const tokenizer::Tokenizer& tok) {
  const int32_t n = tok.vocab_size();
  // SentencePiece vocabularies spell the space as ▁ (and have <0xXX> byte tokens), byte-level ones as Ġ.
  const bool sentencepiece = tok.token_to_id("<0x0A>").has_value() ||
                             (tok.token_to_id("\xE2\x96\x81the").has_value() && !tok.token_to_id("\xC4\xA0the").has_value());
  std::vector<std::string> bytes(n);
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_special(id)) continue;
    std::string s = tok.id_to_token(id);
    if (s.empty()) continue;
    std::string out;
    if (sentencepiece) {
      auto hexval = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
      if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
        out = std::string(1, static_cast<char>(hexval(s[3]) * 16 + hexval(s[4])));
      } else {
        for (size_t i = 0; i < s.size();) {
          if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
            out += ' ';
            i += 3;
          } else {
            out += s[i++];
          }
        }
      }
    } else {
      bool mapped = true;
      for (size_t i = 0; i < s.size() && mapped;) {
        int b = tokenizer::unicode::char_byte(tokenizer::unicode::next_char(s, i));
        if (b < 0) {
          mapped = false;
        } else {
          out += static_cast<char>(b);
        }
      }
      if (!mapped) out = s;  // an added token spelled as plain text
    }
    bytes[id] = std::move(out);
  }
  std::vector<int32_t> stops;
  if (auto e = tok.eos_id()) {
    stops.push_back(*e);
  } else {  // no tokenizer_config.json: the usual end-of-text tokens
    for (const char* name : {"<|end_of_text|>", "<|eot_id|>", "<|endoftext|>", "<|im_end|>", "</s>"})
      if (auto id = tok.token_to_id(name)) stops.push_back(*id);
  }
  return std::make_shared<TokenTable>(std::move(bytes), std::move(stops));
}

TokenTable::TokenTable(std::vector<std::string> bytes, std::vector<int32_t> stop_ids)
    : bytes_(std::move(bytes)), stop_ids_(std::move(stop_ids)) {
  for (int32_t id = 0; id < static_cast<int32_t>(bytes_.size()); ++id) {
    if (bytes_[id].size() > 0xFFFF) bytes_[id].clear();  // offsets are 16-bit; no real token is that long
    if (!bytes_[id].empty()) sorted_.push_back(id);
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  lcp_.assign(sorted_.size(), 0);
  for (size_t k = 1; k < sorted_.size(); ++k) {
    const std::string &a = bytes_[sorted_[k - 1]], &b = bytes_[sorted_[k]];
    size_t l = 0;
    while (l < a.size() && l < b.size() && a[l] == b[l]) ++l;
    lcp_[k] = static_cast<uint16_t>(l);
  }
  byte_begin_.assign(257, static_cast<int32_t>(sorted_.size()));
  for (int32_t k = static_cast<int32_t>(sorted_.size()) - 1; k >= 0; --k) byte_begin_[static_cast<uint8_t>(bytes_[sorted_[k]][0])] = k;
  for (int b = 255; b >= 0; --b) byte_begin_[b] = std::min(byte_begin_[b], byte_begin_[b + 1]);
}

std::shared_ptr<const DfaWalk> TokenTable::dfa_walk(const Dfa& dfa, const std::string& key, int32_t state) const {
  std::string k = key;
  k.append(reinterpret_cast<const char*>(&state), sizeof(state));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = walks_.find(k);
    if (it != walks_.end()) return it->second;
  }
  auto w = std::make_shared<DfaWalk>();
  w->accept.assign(mask_words(), 0);
  std::vector<int32_t> st(1, state);
  std::vector<uint16_t> ex;
  size_t valid = 0;
  // Only tokens whose first byte the state takes are walked; the others die at once with no exit
  // past their first byte (exits at offset 0 belong to other chart items).
  ByteSet first = dfa.first(state);
  for (int b = 0; b < 256; ++b) {
    if (!first[b]) continue;
    auto [k, kend] = first_byte_range(static_cast<uint8_t>(b));
    valid = 0;
    while (k < kend) {
      const std::string& B = bytes_[sorted_[k]];
      size_t d = std::min<size_t>(lcp_[k], valid);
      if (st.size() < B.size() + 1) st.resize(B.size() + 1);
      while (d < B.size()) {
        int32_t t = dfa.step(st[d], static_cast<uint8_t>(B[d]));
        if (t < 0) break;
        st[++d] = t;
      }
      valid = d;
      if (d == B.size()) {
        mask_set(w->accept.data(), sorted_[k]);
        ++k;
        continue;
      }
      ex.clear();
      for (size_t p = 1; p <= d; ++p)
        if (dfa.accepting[st[p]]) ex.push_back(static_cast<uint16_t>(p));
      // Tokens that share the failing prefix fail the same way.
      int32_t j = k;
      do {
        if (!ex.empty()) {
          w->partial.push_back(j);
          w->exit_begin.push_back(static_cast<uint32_t>(w->exits.size()));
          w->exits.insert(w->exits.end(), ex.begin(), ex.end());
        }
        ++j;
      } while (j < kend && lcp_[j] > d);
      k = j;
    }
  }
  w->exit_begin.push_back(static_cast<uint32_t>(w->exits.size()));
  std::lock_guard<std::mutex> lock(mu_);
  // A bound on what a long-running server keeps (maskers hold on to the walks they use).
  if (walks_.size() >= kMaxWalks) walks_.clear();
  auto [it, inserted] = walks_.emplace(std::move(k), std::move(w));
  return it->second;
}

std::shared_ptr<const std::vector<int32_t>> TokenTable::token_classes(const Dfa& dfa, const std::string& key) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = classes_.find(key);
    if (it != classes_.end()) return it->second;
  }
  const int32_t n = dfa.n_states();
  auto out = std::make_shared<std::vector<int32_t>>(n);
  for (int32_t s = 0; s < n; ++s) (*out)[s] = s;
  // L: the longest token prefix made only of bytes the DFA takes somewhere (a bound on any walk).
  ByteSet any;
  for (int32_t s = 0; s < n; ++s) any |= dfa.first(s);
  size_t L = 0, run = 0;  // run: the previous token's prefix of such bytes (neighbours share lcp bytes)
  for (size_t j = 0; j < sorted_.size(); ++j) {
    const std::string& b = bytes_[sorted_[j]];
    size_t k = run < lcp_[j] ? run : lcp_[j];
    if (k == lcp_[j])
      while (k < b.size() && any[static_cast<uint8_t>(b[k])]) ++k;
    run = k;
    L = std::max(L, k);
  }
  // Moore's refinement for L + 1 rounds: states in one block agree on all strings of length <= L.
  if (static_cast<double>(n) * dfa.n_cls * (L + 1) < 5e7) {
    std::vector<int32_t> block(n), nb(n);
    for (int32_t s = 0; s < n; ++s) block[s] = dfa.accepting[s];
    int32_t n_blocks = 0;
    for (size_t round = 0; round <= L; ++round) {
      std::unordered_map<std::vector<int32_t>, int32_t, StateSetHash> sig;
      std::vector<int32_t> k(dfa.n_cls + 1);
      for (int32_t s = 0; s < n; ++s) {
        k[0] = block[s];
        for (int c = 0; c < dfa.n_cls; ++c) {
          int32_t t = dfa.next[static_cast<size_t>(s) * dfa.n_cls + c];
          k[c + 1] = t < 0 ? -1 : block[t];
        }
        nb[s] = sig.emplace(k, static_cast<int32_t>(sig.size())).first->second;
      }
      block.swap(nb);
      if (static_cast<int32_t>(sig.size()) == n_blocks) break;
      n_blocks = static_cast<int32_t>(sig.size());
    }
    std::vector<int32_t> first(n, -1);
    for (int32_t s = 0; s < n; ++s) {
      if (first[block[s]] < 0) first[block[s]] = s;
      (*out)[s] = first[block[s]];
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  return classes_.emplace(key, std::move(out)).first->second;
}

// ---- TokenMasker ----

TokenMasker::TokenMasker(std::shared_ptr<const CompiledGrammar> g, std::shared_ptr<const TokenTable> table, bool precompute)
    : g_(std::move(g)), table_(std::move(table)) {
  for (int32_t t = 0; t < g_->n_terms(); ++t) {
    keys_.push_back(g_->dfa(t).key());
    classes_.push_back(g_->dfa(t).n_states() > kEagerStates ? table_->token_classes(g_->dfa(t), keys_.back()) : nullptr);
  }
  if (!precompute) return;
  const auto& P = g_->pos();
  // Every live state of small terminals (strings, numbers, literals: the DFA walks are shared by all
  // grammars on this table); the states of large ones (long counted repetitions) fill in when met.
  for (int32_t p = 0; p < static_cast<int32_t>(P.size()); ++p) {
    if (P[p].kind != CompiledGrammar::Term) continue;
    const Dfa& d = g_->dfa(P[p].id);
    const int32_t n = d.n_states() <= kEagerStates ? d.n_states() : 1;
    for (int32_t s = 0; s < n; ++s)
      if (d.live[s]) entry(p, s);
  }
}

size_t TokenMasker::n_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::shared_ptr<const TokenMasker::Entry> TokenMasker::entry(int32_t pos, int32_t state) const {
  if (const auto& cls = classes_[g_->pos()[pos].id]) state = (*cls)[state];  // a state no token tells apart
  uint64_t key = (static_cast<uint64_t>(pos) << 32) | static_cast<uint32_t>(state);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
  }
  std::shared_ptr<const Entry> e = compute(pos, state);
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.emplace(key, std::move(e)).first->second;
}

// 0 rejected, 1 uncertain (the rule of q completes with bytes left that may follow it), 2 accepted.
int TokenMasker::tail(Chart& c, int32_t q, std::string_view bytes) const {
  const ByteSet& follow = g_->follow(g_->pos()[q].lhs);
  c.start_at(q);
  int res = 0;
  for (char ch : bytes) {
    uint8_t b = static_cast<uint8_t>(ch);
    if (c.exited() && follow[b]) res = 1;
    if (!c.push(b)) return res;
  }
  return 2;
}

std::shared_ptr<TokenMasker::Entry> TokenMasker::compute(int32_t pos, int32_t state) const {
  const auto& P = g_->pos();
  const int32_t term = P[pos].id;
  const Dfa& dfa = g_->dfa(term);
  auto e = std::make_shared<Entry>();
  auto walk = table_->dfa_walk(dfa, keys_[term], state);
  e->walks.push_back(walk);
  const int32_t q = pos + 1;
  const ByteSet& next = g_->first_from(q);
  Chart c(*g_);
  const auto& sorted = table_->sorted();
  for (size_t i = 0; i < walk->partial.size(); ++i) {
    int32_t idx = walk->partial[i];
    const std::string& B = table_->bytes(sorted[idx]);
    int best = 0;
    for (uint32_t x = walk->exit_begin[i]; x < walk->exit_begin[i + 1] && best < 2; ++x) {
      uint16_t p = walk->exits[x];
      if (!next[static_cast<uint8_t>(B[p])]) continue;
      best = std::max(best, tail(c, q, std::string_view(B).substr(p)));
    }
    if (best == 2) {
      e->accept.push_back(sorted[idx]);
    } else if (best == 1) {
      e->uncertain.push_back(idx);
    }
  }
  return e;
}

void TokenMasker::fill_mask(Matcher& m, uint32_t* mask) const {
  const size_t words = table_->mask_words();
  std::fill(mask, mask + words, 0u);
  const auto& P = g_->pos();
  // The terminal items of the last set, deduplicated by (position, state).
  std::vector<uint64_t> keys;
  for (const Item& it : m.chart().last())
    if (P[it.pos].kind == CompiledGrammar::Term) keys.push_back((static_cast<uint64_t>(it.pos) << 32) | static_cast<uint32_t>(it.state));
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<int32_t> cand;
  const std::vector<int32_t>* only = nullptr;  // the one uncertain list, when just one entry has any
  size_t n_lists = 0;
  std::vector<std::shared_ptr<const Entry>> held;
  const DfaWalk* last_walk = nullptr;
  for (uint64_t k : keys) {
    auto e = entry(static_cast<int32_t>(k >> 32), static_cast<int32_t>(k & 0xFFFFFFFF));
    for (const auto& w : e->walks) {
      if (w.get() == last_walk) continue;
      last_walk = w.get();
      const uint32_t* a = w->accept.data();
      for (size_t i = 0; i < words; ++i) mask[i] |= a[i];
    }
    for (int32_t id : e->accept) mask_set(mask, id);
    if (!e->uncertain.empty()) {
      ++n_lists;
      only = &e->uncertain;
      cand.insert(cand.end(), e->uncertain.begin(), e->uncertain.end());
    }
    held.push_back(std::move(e));
  }
  if (n_lists > 1) {
    std::sort(cand.begin(), cand.end());
    cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
    only = &cand;
  }
  if (only) {
    // Check the uncertain tokens on the real chart, in trie order (shared prefixes parsed once).
    Chart& c = m.chart();
    const size_t base = c.depth();
    const auto& sorted = table_->sorted();
    const std::string* prev = nullptr;
    size_t pushed = 0;
    for (int32_t idx : *only) {
      int32_t id = sorted[idx];
      if (mask_test(mask, id)) continue;
      const std::string& B = table_->bytes(id);
      size_t common = 0;
      if (prev) {
        size_t lim = std::min({pushed, prev->size(), B.size()});
        while (common < lim && (*prev)[common] == B[common]) ++common;
      }
      c.truncate(base + common);
      pushed = common;
      bool ok = true;
      while (pushed < B.size()) {
        if (!c.push(static_cast<uint8_t>(B[pushed]))) {
          ok = false;
          break;
        }
        ++pushed;
      }
      if (ok) mask_set(mask, id);
      prev = &B;
    }
    c.truncate(base);
  }
  if (m.is_complete())
    for (int32_t id : table_->stop_ids()) mask_set(mask, id);
}

void TokenMasker::fill_mask_brute(const Matcher& m, uint32_t* mask) const {
  std::fill(mask, mask + table_->mask_words(), 0u);
  Chart c = m.chart();
  const size_t base = c.depth();
  for (int32_t id = 0; id < table_->vocab_size(); ++id) {
    const std::string& B = table_->bytes(id);
    if (B.empty()) continue;
    bool ok = true;
    for (char ch : B) {
      if (!c.push(static_cast<uint8_t>(ch))) {
        ok = false;
        break;
      }
    }
    if (ok) mask_set(mask, id);
    c.truncate(base);
  }
  if (m.is_complete())
    for (int32_t id : table_->stop_ids()) mask_set(mask, id);
}

bool TokenMasker::accept_token(Matcher& m, int32_t id) const {
  if (id < 0 || id >= table_->vocab_size()) return false;
  for (int32_t s : table_->stop_ids())
    if (s == id) return m.is_complete();
  const std::string& B = table_->bytes(id);
  return !B.empty() && m.accept_bytes(B);
}

}  // namespace kiln::grammar
