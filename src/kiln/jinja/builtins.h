// The interpreter's built-in behaviour, as free functions over Values: operators, attribute and
// item access (jinja2's sandboxed getattr/getitem), str/dict/list methods, str.format and
// printf-style %, filters, tests and global functions.
#pragma once
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "kiln/jinja/value.h"

namespace kiln::jinja {

// ---- operators (operators.cpp) ----
// op in {+ - * / // % ** ~}; Python semantics (str/list concatenation and repetition, true
// division, floor division/modulo toward -inf, str % args formatting).
Value binary_op(const std::string& op, const Value& a, const Value& b);
// op in {"-", "+"}.
Value unary_op(const std::string& op, const Value& a);
// Python `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);
// op in {== != < <= > >= in notin}.
bool compare_op(const std::string& op, const Value& a, const Value& b);
// The items a for-loop / list() sees: list items, dict keys, string characters; Undefined is empty.
std::vector<Value> iterate(const Value& v);
// len(v); Undefined is 0.
int64_t length(const Value& v);
// Python's int()/float() of a value, nullopt when Python raises.
std::optional<int64_t> to_int(const Value& v);
std::optional<double> to_float(const Value& v);

// ---- access and methods (methods.cpp) ----
// obj.name: a method first (bound as a Function value), then obj[name]; Undefined when absent.
Value get_attribute(const Value& obj, const std::string& name);
// obj[key]: the item first, then a method named key; Undefined when absent.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] for lists, tuples and strings.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Calls a Function or callable Object; anything else raises.
Value call_value(const Value& callee, const CallArgs& args);

// ---- formatting (format.cpp) ----
// format(value, spec) with Python's format-spec mini language.
std::string format_value(const Value& v, const std::string& spec);
// str.format(*args, **kwargs).
std::string str_format(const std::string& fmt, const CallArgs& args);
// fmt % args (args: a tuple, a dict for %(name)s, or one value).
std::string percent_format(const std::string& fmt, const Value& args);

// ---- filters and tests (filters.cpp) ----
// `value|name(args)`. Filters jinja2 has but the interpreter lacks raise "unsupported filter".
Value apply_filter(const std::string& name, const Value& value, const CallArgs& args);
// `value is name(args)`.
bool apply_test(const std::string& name, const Value& value, const CallArgs& args);

// ---- globals (globals.cpp) ----
// range, dict, cycler/joiner/lipsum (unsupported), raise_exception, strftime_now; the renderer adds namespace.
// strftime_now formats the current local time, or KILN_FAKE_DATE ("YYYY-MM-DD[THH:MM[:SS]]").
void add_globals(DictData& globals);
std::string strftime_now(const std::string& format);

// Binds a call's arguments to a Python-style signature: positional then keyword, an error for
// unknown keywords or too many arguments. `what` names the callee in messages.
class ArgBinder {
 public:
  ArgBinder(std::string what, const CallArgs& args, std::initializer_list<const char*> names);
  // The i-th parameter, or null when not given.
  const Value* get(size_t i) const { return i < bound_.size() ? bound_[i] : nullptr; }
  Value get_or(size_t i, Value fallback) const { return get(i) ? *get(i) : std::move(fallback); }
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  std::vector<const Value*> bound_;
};

}  // namespace kiln::jinja
