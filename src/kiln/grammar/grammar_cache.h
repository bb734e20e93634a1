// Compiled grammars by source text: a request's schema or grammar is compiled (and its token
// classes precomputed) once, then shared by every sequence that uses it. Bounded, least recently
// used first out; thread-safe (two threads asking for the same new key may both compile it once).
#pragma once
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/token_mask.h"

namespace kiln::grammar {

enum class Source { json_schema, json_object, gbnf, regex };

struct CompiledSource {
  std::shared_ptr<const TokenMasker> masker;
  std::vector<std::string> warnings;  // JSON Schema keywords not enforced (empty under strict: those throw)
};

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const TokenTable> table, size_t capacity = 64) : table_(std::move(table)), capacity_(capacity) {}
  // Compiles on a miss; errors (kiln::Error "[grammar] ...") are not cached.
  CompiledSource get(Source kind, const std::string& text, const SchemaOptions& options = {});
  size_t size() const;

 private:
  std::shared_ptr<const TokenTable> table_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  struct Slot {
    CompiledSource value;
    std::list<std::string>::iterator pos;
  };
  std::unordered_map<std::string, Slot> map_;
};

}  // namespace kiln::grammar
