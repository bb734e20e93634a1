// Values of the Jinja interpreter, with Python semantics: what a chat template sees when
// transformers renders it (None/True/False printing, int vs float, dict insertion order,
// jinja2's default Undefined), plus conversion from/to JSON (json.dumps with HF's settings).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kiln::jinja {

// A failure while rendering (Python's TypeError, UndefinedError, ...). The renderer adds the
// template line and turns it into kiln::Error("template", ...).
class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& message) : std::runtime_error(message) {}
};

// raise_exception(message) from a template: reported as "raise_exception: message".
class RaisedError : public TemplateError {
 public:
  explicit RaisedError(const std::string& message) : TemplateError(message) {}
};

class Value;
struct DictData;
class Object;
struct Function;

using ListPtr = std::shared_ptr<const std::vector<Value>>;
using DictPtr = std::shared_ptr<const DictData>;

// Arguments of a call: positional then keyword, as Python passes them.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

class Value {
 public:
  enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object, Function };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = "") {
    Value v;
    v.s_ = std::move(hint);
    return v;
  }
  static Value none() { return with_type(Type::None); }
  static Value boolean(bool b) { return with_type(Type::Bool, b); }
  static Value integer(int64_t i) { return with_type(Type::Int, i); }
  static Value number(double f) {
    Value v = with_type(Type::Float);
    v.f_ = f;
    return v;
  }
  static Value string(std::string s, bool markup = false) {
    Value v = with_type(Type::String);
    v.s_ = std::move(s);
    v.flag_ = markup;
    return v;
  }
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(DictData data);
  static Value object(std::shared_ptr<Object> o);
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::Undefined; }
  bool is_none() const { return type_ == Type::None; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_int() const { return type_ == Type::Int; }
  bool is_float() const { return type_ == Type::Float; }
  bool is_number() const { return type_ == Type::Bool || type_ == Type::Int || type_ == Type::Float; }
  bool is_string() const { return type_ == Type::String; }
  bool is_list() const { return type_ == Type::List; }
  bool is_tuple() const { return type_ == Type::List && flag_; }
  bool is_dict() const { return type_ == Type::Dict; }
  bool is_object() const { return type_ == Type::Object; }
  bool is_function() const { return type_ == Type::Function; }
  bool is_markup() const { return type_ == Type::String && flag_; }

  bool as_bool() const { return i_ != 0; }
  // Bool/Int value; a Float truncates (saturating, NaN -> 0) so a stray call is never UB.
  int64_t as_int() const { return type_ == Type::Float ? float_to_int(f_) : i_; }
  double as_double() const { return type_ == Type::Float ? f_ : static_cast<double>(i_); }
  const std::string& str() const { return s_; }  // String; for Undefined, the error hint
  const std::vector<Value>& items() const { return *list_; }
  const DictData& dict() const { return *dict_; }
  const std::shared_ptr<Object>& obj() const { return obj_; }
  const Function& fn() const { return *fn_; }
  const ListPtr& list_ptr() const { return list_; }
  // Nesting depth of lists/dicts (0 for scalars); creation fails past kMaxNesting.
  uint32_t depth() const { return depth_; }
  static constexpr uint32_t kMaxNesting = 512;

 private:
  static int64_t float_to_int(double f) {
    if (!(f == f)) return 0;
    if (f >= 9.2233720368547758e18) return INT64_MAX;
    if (f <= -9.2233720368547758e18) return INT64_MIN;
    return static_cast<int64_t>(f);
  }
  static Value with_type(Type t, int64_t i = 0) {  // i: a Bool's or an Int's value
    Value v;
    v.type_ = t;
    v.i_ = i;
    return v;
  }
  Type type_ = Type::Undefined;
  bool flag_ = false;  // List: tuple; String: Markup (from |safe / |escape)
  uint32_t depth_ = 0;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  ListPtr list_;
  DictPtr dict_;
  std::shared_ptr<Object> obj_;
  std::shared_ptr<const Function> fn_;
};

// A Python dict: insertion-ordered (key, value) pairs. Keys are hashable scalars (str, int,
// bool, None, float); lookup is a linear scan (template dicts are small).
struct DictData {
  std::vector<std::pair<Value, Value>> entries;
  const Value* find(const Value& key) const;
  void set(Value key, Value value);  // replaces an equal key in place, else appends
};

struct Function {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

// Objects with attributes: namespace(), the loop variable, ... (mutable, shared by reference).
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;
  // Undefined when the attribute does not exist.
  virtual Value get_attr(const std::string& name) = 0;
  // False when the object does not accept attribute assignment.
  virtual bool set_attr(const std::string& name, const Value& value) { return false; }
  virtual std::string repr() const { return "<" + type_name() + " object>"; }
  // True for callables (a recursive loop): call() renders.
  virtual bool callable() const { return false; }
  virtual Value call(const CallArgs& args) { throw TemplateError("'" + type_name() + "' object is not callable"); }
};

// jinja2's Namespace: attributes settable with {% set ns.attr = value %}.
class Namespace : public Object {
 public:
  DictData attrs;
  std::string type_name() const override { return "Namespace"; }
  Value get_attr(const std::string& name) override;
  bool set_attr(const std::string& name, const Value& value) override;
  std::string repr() const override;
};

// Python's name of the value's type ("str", "int", "NoneType", "dict", ...).
std::string type_name(const Value& v);
// str(v) as jinja2 prints it: Undefined -> "", None -> "None", floats as Python repr.
std::string to_str(const Value& v);
// repr(v): strings quoted the Python way; containers nest repr.
std::string repr(const Value& v);
// Python truthiness.
bool truthy(const Value& v);
// Python ==.
bool equals(const Value& a, const Value& b);
// Python <: -1/0/1; throws TemplateError for unorderable types ("'<' not supported ...").
int compare(const Value& a, const Value& b, const char* op = "<");
// Python float repr (shortest round-trip, "1.0", "1e-05", "1e+16", "inf", "nan").
std::string float_repr(double f);
// Raises TemplateError with the Undefined's hint ("'x' is undefined").
[[noreturn]] void fail_undefined(const Value& v);

// JSON <-> Value. Objects keep key order (ordered_json); integers stay ints, reals floats.
Value from_json(const nlohmann::ordered_json& j);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) byte for byte. indent: nullopt-like
// when indent_str is null; separators default to (", ", ": ") or (",", ": ") with an indent.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  const std::string* indent = nullptr;  // null: no indent
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonDumpOptions& opt);

}  // namespace kiln::jinja
