// GrammarCache (grammar_cache.h).
#include "kiln/grammar/grammar_cache.h"

namespace kiln::grammar {

CompiledSource GrammarCache::get(Source kind, const std::string& text, const SchemaOptions& options) {
  std::string key;
  key += static_cast<char>('0' + static_cast<int>(kind));
  key += options.strict ? 's' : '-';
  key += options.additional_properties ? 'a' : '-';
  key += options.whitespace ? 'w' : '-';
  key += text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.pos);
      return it->second.value;
    }
  }
  CompiledSource c;
  Grammar g;
  switch (kind) {
    case Source::json_schema: {
      SchemaGrammar sg = json_schema_grammar(text, options);
      g = std::move(sg.grammar);
      c.warnings = std::move(sg.warnings);
      break;
    }
    case Source::json_object: g = json_object_grammar(options); break;
    case Source::gbnf: g = parse_gbnf(text); break;
    case Source::regex: g = regex_grammar(text); break;
  }
  c.masker = std::make_shared<TokenMasker>(std::make_shared<CompiledGrammar>(g), table_);
  std::lock_guard<std::mutex> lock(mu_);
  if (map_.count(key)) return map_[key].value;
  lru_.push_front(key);
  map_.emplace(key, Slot{c, lru_.begin()});
  while (map_.size() > capacity_) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
  return c;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.size();
}

}  // namespace kiln::grammar
