// The Earley chart and the token-level Matcher (matcher.h).
#include "kiln/grammar/matcher.h"

#include "kiln/base/error.h"

namespace kiln::grammar {

namespace {
uint64_t item_key(const Item& it) {
  return static_cast<uint64_t>(it.pos) | (static_cast<uint64_t>(it.origin) << 24) | (static_cast<uint64_t>(it.state) << 48);
}
uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}
}  // namespace

void Chart::begin_set() {
  starts_.push_back(static_cast<uint32_t>(items_.size()));
  flags_.push_back(0);
  ++gen_;
  hcount_ = 0;
  if (hkeys_.empty()) {
    hkeys_.assign(256, 0);
    hstamp_.assign(256, 0);
  }
}

void Chart::start() {
  items_.clear();
  starts_.clear();
  flags_.clear();
  exit_rule_ = -1;
  begin_set();
  add_at(static_cast<uint32_t>(g_->alts(g_->start_rule())[0]), 0);
  close(0);
}

void Chart::start_at(int32_t pos) {
  items_.clear();
  starts_.clear();
  flags_.clear();
  exit_rule_ = g_->pos()[pos].lhs;
  begin_set();
  add_at(static_cast<uint32_t>(pos), 0);
  close(0);
}

void Chart::add_item(const Item& it) {
  if (hcount_ * 2 >= hkeys_.size()) {  // grow and re-insert the current set
    size_t cap = hkeys_.size() * 2;
    hkeys_.assign(cap, 0);
    hstamp_.assign(cap, 0);
    ++gen_;
    hcount_ = 0;
    for (size_t i = starts_.back(); i < items_.size(); ++i) {
      uint64_t k = item_key(items_[i]);
      size_t h = mix(k) & (cap - 1);
      while (hstamp_[h] == gen_) h = (h + 1) & (cap - 1);
      hstamp_[h] = gen_;
      hkeys_[h] = k;
      ++hcount_;
    }
  }
  uint64_t k = item_key(it);
  size_t mask = hkeys_.size() - 1;
  size_t h = mix(k) & mask;
  while (hstamp_[h] == gen_) {
    if (hkeys_[h] == k) return;
    h = (h + 1) & mask;
  }
  hstamp_[h] = gen_;
  hkeys_[h] = k;
  ++hcount_;
  items_.push_back(it);
}

void Chart::add_term(uint32_t pos, uint32_t origin, int32_t state) {
  const Dfa& d = g_->dfa(g_->pos()[pos].id);
  if (d.live[state]) add_item(Item{pos, origin, state});
  if (d.accepting[state]) add_at(pos + 1, origin);
}

void Chart::add_at(uint32_t pos, uint32_t origin) {
  if (g_->pos()[pos].kind == CompiledGrammar::Term) {
    add_term(pos, origin, 0);
  } else {
    add_item(Item{pos, origin, 0});
  }
}

void Chart::close(uint32_t set) {
  const auto& P = g_->pos();
  for (size_t i = starts_[set]; i < items_.size(); ++i) {
    Item it = items_[i];
    const auto& p = P[it.pos];
    if (p.kind == CompiledGrammar::Rule) {
      for (int32_t a : g_->alts(p.id)) add_at(static_cast<uint32_t>(a), set);
      if (g_->rule_nullable(p.id)) add_at(it.pos + 1, it.origin);
    } else if (p.kind == CompiledGrammar::End) {
      if (it.origin == 0) {
        if (p.lhs == g_->start_rule()) flags_[set] |= kComplete;
        if (p.lhs == exit_rule_) flags_[set] |= kExited;
      }
      if (it.origin == set) continue;  // an empty completion: prediction already stepped over it
      uint32_t b = starts_[it.origin], e = it.origin + 1 < starts_.size() ? starts_[it.origin + 1] : static_cast<uint32_t>(items_.size());
      for (uint32_t j = b; j < e; ++j) {
        const Item& w = items_[j];
        const auto& wp = P[w.pos];
        if (wp.kind == CompiledGrammar::Rule && wp.id == p.lhs) add_at(w.pos + 1, w.origin);
      }
    }
  }
}

bool Chart::push(uint8_t b) {
  KILN_ASSERT(starts_.size() < (1u << 24), "grammar input too long");
  uint32_t prev = starts_.back(), end = static_cast<uint32_t>(items_.size());
  uint32_t set = static_cast<uint32_t>(starts_.size());
  begin_set();
  const auto& P = g_->pos();
  for (uint32_t i = prev; i < end; ++i) {
    Item it = items_[i];
    if (P[it.pos].kind != CompiledGrammar::Term) continue;
    int32_t ns = g_->dfa(P[it.pos].id).step(it.state, b);
    if (ns >= 0) add_term(it.pos, it.origin, ns);
  }
  if (items_.size() == end) {
    starts_.pop_back();
    flags_.pop_back();
    return false;
  }
  close(set);
  return true;
}

void Chart::pop() {
  items_.resize(starts_.back());
  starts_.pop_back();
  flags_.pop_back();
}

void Chart::truncate(size_t n_sets) {
  if (n_sets >= starts_.size()) return;
  items_.resize(starts_[n_sets]);
  starts_.resize(n_sets);
  flags_.resize(n_sets);
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g) : g_(std::move(g)), chart_(*g_) { chart_.start(); }

bool Matcher::accept_bytes(std::string_view bytes) {
  size_t depth = chart_.depth();
  for (char c : bytes) {
    if (!chart_.push(static_cast<uint8_t>(c))) {
      chart_.truncate(depth);
      return false;
    }
  }
  marks_.push_back(depth);
  return true;
}

void Matcher::rollback(size_t n) {
  KILN_ASSERT(n <= marks_.size(), "rollback of {} tokens past the {} accepted", n, marks_.size());
  if (n == 0) return;
  size_t depth = marks_[marks_.size() - n];
  chart_.truncate(depth);
  marks_.resize(marks_.size() - n);
}

bool Matcher::can_continue() const {
  for (const Item& it : chart_.last())
    if (g_->pos()[it.pos].kind == CompiledGrammar::Term) return true;
  return false;
}

}  // namespace kiln::grammar
