// Grammar IR helpers and CompiledGrammar (grammar.h).
#include "kiln/grammar/grammar.h"

#include <unordered_map>

#include "kiln/base/error.h"

namespace kiln::grammar {

int32_t Grammar::add_rule(std::string name) {
  rules.push_back(Rule{std::move(name), {}});
  return static_cast<int32_t>(rules.size() - 1);
}

Sym Grammar::term(ReP re) {
  terms.push_back(std::move(re));
  return Sym{Sym::Term, static_cast<int32_t>(terms.size() - 1)};
}

std::string Grammar::dump() const {
  std::string out;
  for (size_t r = 0; r < rules.size(); ++r) {
    out += rules[r].name + " ::=";
    for (size_t a = 0; a < rules[r].alts.size(); ++a) {
      if (a) out += " |";
      for (const Sym& s : rules[r].alts[a]) out += s.kind == Sym::Rule ? " " + rules[s.id].name : " t" + std::to_string(s.id);
      if (rules[r].alts[a].empty()) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

CompiledGrammar::CompiledGrammar(const Grammar& g) {
  if (g.rules.empty() || g.start < 0 || g.start >= static_cast<int32_t>(g.rules.size())) fail("grammar", "the grammar has no start rule");
  const int32_t n_rules = static_cast<int32_t>(g.rules.size());
  // 1. Alternatives with adjacent literal terminals merged; terminals compiled once each.
  std::vector<ReP> terms;
  std::unordered_map<const Re*, int32_t> term_of;
  auto term_id = [&](const ReP& re) {
    auto it = term_of.find(re.get());
    if (it != term_of.end()) return it->second;
    terms.push_back(re);
    dfas_.push_back(cached_dfa(*re));
    int32_t id = static_cast<int32_t>(terms.size() - 1);
    term_of.emplace(re.get(), id);
    return id;
  };
  std::vector<std::vector<std::vector<Sym>>> rules(n_rules);
  for (int32_t r = 0; r < n_rules; ++r) {
    for (const auto& alt : g.rules[r].alts) {
      std::vector<Sym> out;
      ReP pending;  // a run of literals
      auto flush = [&] {
        if (pending) out.push_back(Sym{Sym::Term, term_id(pending)});
        pending.reset();
      };
      for (const Sym& s : alt) {
        if (s.kind == Sym::Rule) {
          if (s.id < 0 || s.id >= n_rules) fail("grammar", "rule {} refers to a missing rule", printable(g.rules[r].name));
          flush();
          out.push_back(s);
          continue;
        }
        const ReP& re = g.terms.at(s.id);
        if (re_is_literal(*re)) {
          pending = pending ? re_concat({pending, re}) : re;
        } else {
          flush();
          out.push_back(Sym{Sym::Term, term_id(re)});
        }
      }
      flush();
      rules[r].push_back(std::move(out));
    }
  }
  // 2. Productive rules; alternatives that can never match are dropped.
  auto term_empty = [&](int32_t t) { return !dfas_[t]->accepting[0] && !dfas_[t]->live[0]; };
  std::vector<uint8_t> productive(n_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < n_rules; ++r) {
      if (productive[r]) continue;
      for (const auto& alt : rules[r]) {
        bool ok = true;
        for (const Sym& s : alt) ok = ok && (s.kind == Sym::Term ? !term_empty(s.id) : productive[s.id] != 0);
        if (ok) {
          productive[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  if (!productive[g.start]) fail("grammar", "the grammar matches nothing (rule {} can never complete)", printable(g.rules[g.start].name));
  for (auto& alts : rules) {
    std::erase_if(alts, [&](const std::vector<Sym>& alt) {
      for (const Sym& s : alt)
        if (s.kind == Sym::Term ? term_empty(s.id) : !productive[s.id]) return true;
      return false;
    });
  }
  // 3. S' -> S, then the flat layout.
  start_ = n_rules;
  rules.push_back({{Sym{Sym::Rule, g.start}}});
  const int32_t nr = n_rules + 1;
  alts_.resize(nr);
  for (int32_t r = 0; r < nr; ++r) {
    names_.push_back(r < n_rules ? g.rules[r].name : "<start>");
    for (const auto& alt : rules[r]) {
      alts_[r].push_back(static_cast<int32_t>(pos_.size()));
      for (const Sym& s : alt) pos_.push_back(Pos{s.kind == Sym::Term ? Term : Rule, s.id, r});
      pos_.push_back(Pos{End, r, r});
    }
  }
  // The matcher packs an item as 24 bits of position and 16 of DFA state.
  if (pos_.size() >= (1u << 24)) fail("grammar", "the grammar is too large ({} positions)", pos_.size());
  for (const auto& d : dfas_)
    if (d->n_states() >= (1 << 16)) fail("grammar", "a terminal is too large ({} DFA states)", d->n_states());
  // 4. Nullable rules and FIRST sets.
  nullable_.assign(nr, 0);
  std::vector<ByteSet> first(nr);
  auto sym_nullable = [&](const Pos& p) { return p.kind == Term ? dfas_[p.id]->accepting[0] != 0 : nullable_[p.id] != 0; };
  auto sym_first = [&](const Pos& p) { return p.kind == Term ? dfas_[p.id]->first(0) : first[p.id]; };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < nr; ++r) {
      for (int32_t a : alts_[r]) {
        bool all_null = true;
        ByteSet f;
        for (int32_t p = a; pos_[p].kind != End; ++p) {
          f |= sym_first(pos_[p]);
          if (!sym_nullable(pos_[p])) {
            all_null = false;
            break;
          }
        }
        if ((f | first[r]) != first[r]) {
          first[r] |= f;
          changed = true;
        }
        if (all_null && !nullable_[r]) {
          nullable_[r] = 1;
          changed = true;
        }
      }
    }
  }
  // 5. FOLLOW sets, then first_from per position.
  follow_.assign(nr, ByteSet());
  follow_eos_.assign(nr, 0);
  follow_eos_[start_] = 1;
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < nr; ++r) {
      for (int32_t a : alts_[r]) {
        for (int32_t p = a; pos_[p].kind != End; ++p) {
          if (pos_[p].kind != Rule) continue;
          int32_t b = pos_[p].id;
          ByteSet f;
          bool tail_null = true;
          for (int32_t q = p + 1; pos_[q].kind != End; ++q) {
            f |= sym_first(pos_[q]);
            if (!sym_nullable(pos_[q])) {
              tail_null = false;
              break;
            }
          }
          if (tail_null) {
            f |= follow_[r];
            if (follow_eos_[r] && !follow_eos_[b]) {
              follow_eos_[b] = 1;
              changed = true;
            }
          }
          if ((follow_[b] | f) != follow_[b]) {
            follow_[b] |= f;
            changed = true;
          }
        }
      }
    }
  }
  first_from_.assign(pos_.size(), ByteSet());
  for (int32_t p = static_cast<int32_t>(pos_.size()) - 1; p >= 0; --p) {
    const Pos& s = pos_[p];
    if (s.kind == End) {
      first_from_[p] = follow_[s.lhs];
    } else {
      first_from_[p] = sym_first(s);
      if (sym_nullable(s)) first_from_[p] |= first_from_[p + 1];
    }
  }
}

}  // namespace kiln::grammar
