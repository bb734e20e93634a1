// The parser state of a grammar: a byte-level Earley chart (one item set per input byte), and the
// Matcher around it that advances by whole tokens and rolls back (speculative decoding).
//
// An item is (position, origin, DFA state): the position names an alternative and how far into it
// the parse is; while it sits in a terminal, the DFA state says how far into the terminal. Nullable
// rules follow Aycock & Horspool (predicting a nullable rule also steps over it), repetitions are left
// recursive (constant-size sets). Every set is kept, so rolling back is dropping sets.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/grammar/grammar.h"

namespace kiln::grammar {

struct Item {
  uint32_t pos;
  uint32_t origin;
  int32_t state;  // DFA state while pos is a terminal, else 0
  bool operator==(const Item&) const = default;
};

class Chart {
 public:
  explicit Chart(const CompiledGrammar& g) : g_(&g) {}
  // Set 0 holds the start rule's predictions.
  void start();
  // A sub-parse for precomputation: set 0 holds the closure of (pos, origin 0); completing that
  // item's rule at origin 0 marks the set as exited (the rest of the input belongs to the unknown parent).
  void start_at(int32_t pos);
  // Scans one byte into a new set; false (nothing pushed) when no item takes it.
  bool push(uint8_t b);
  void pop();
  void truncate(size_t n_sets);
  size_t depth() const { return starts_.size(); }
  bool complete() const { return !flags_.empty() && (flags_.back() & kComplete); }
  bool exited() const { return !flags_.empty() && (flags_.back() & kExited); }
  std::span<const Item> last() const { return {items_.data() + starts_.back(), items_.size() - starts_.back()}; }
  const CompiledGrammar& grammar() const { return *g_; }
  bool operator==(const Chart& o) const { return items_ == o.items_ && starts_ == o.starts_ && flags_ == o.flags_; }

 private:
  static constexpr uint8_t kComplete = 1, kExited = 2;
  void add_at(uint32_t pos, uint32_t origin);
  void add_term(uint32_t pos, uint32_t origin, int32_t state);
  void add_item(const Item& it);
  void close(uint32_t set);
  void begin_set();

  const CompiledGrammar* g_;
  std::vector<Item> items_;
  std::vector<uint32_t> starts_;  // set k is items_[starts_[k], starts_[k+1])
  std::vector<uint8_t> flags_;
  int32_t exit_rule_ = -1;
  // Dedup of the set being built: open addressing over item keys, stamped per set.
  std::vector<uint64_t> hkeys_;
  std::vector<uint32_t> hstamp_;
  uint32_t gen_ = 0;
  size_t hcount_ = 0;
};

// A grammar state that advances by tokens (their bytes).
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> g);
  // Feeds one token's bytes; false, and the state unchanged, when the grammar rejects them.
  bool accept_bytes(std::string_view bytes);
  // Takes back the last n tokens (n <= n_tokens()).
  void rollback(size_t n);
  size_t n_tokens() const { return marks_.size(); }
  // The output so far is a whole sentence of the grammar (a stop token may come now).
  bool is_complete() const { return chart_.complete(); }
  // Some byte may still follow.
  bool can_continue() const;
  Chart& chart() { return chart_; }
  const Chart& chart() const { return chart_; }
  const std::shared_ptr<const CompiledGrammar>& grammar() const { return g_; }
  bool operator==(const Matcher& o) const { return chart_ == o.chart_ && marks_ == o.marks_; }

 private:
  std::shared_ptr<const CompiledGrammar> g_;
  Chart chart_;
  std::vector<size_t> marks_;  // chart depth before each accepted token
};

}  // namespace kiln::grammar
