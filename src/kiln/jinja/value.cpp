// Python semantics of Jinja values: printing (str/repr), truthiness, ==/<, JSON in and out.
// json_dumps reproduces Python's json.dumps byte for byte (what transformers' tojson calls).
#include "kiln/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "kiln/base/utf8.h"
#include "kiln/jinja/strings.h"

namespace kiln::jinja {

namespace {

// Bounds the nesting of data so that printing, comparing and freeing it never recurse deeply.
uint32_t nested_depth(uint32_t child_max) {
  if (child_max + 1 > Value::kMaxNesting) throw TemplateError("data nested too deeply (over 512 levels)");
  return child_max + 1;
}

// Recursion guard for repr of objects, which may refer to themselves (`set ns.me = ns`).
thread_local int repr_depth = 0;

}  // namespace

Value Value::list(std::vector<Value> items, bool tuple) {
  Value v = with_type(Type::List);
  uint32_t child = 0;
  for (const auto& x : items) child = std::max(child, x.depth_);
  v.depth_ = nested_depth(child);
  v.list_ = std::make_shared<const std::vector<Value>>(std::move(items));
  v.flag_ = tuple;
  return v;
}

Value Value::dict(DictData data) {
  Value v = with_type(Type::Dict);
  uint32_t child = 0;
  for (const auto& [k, x] : data.entries) child = std::max(child, x.depth_);
  v.depth_ = nested_depth(child);
  v.dict_ = std::make_shared<const DictData>(std::move(data));
  return v;
}

Value Value::object(std::shared_ptr<Object> o) {
  Value v = with_type(Type::Object);
  v.obj_ = std::move(o);
  return v;
}

Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  Value v = with_type(Type::Function);
  v.fn_ = std::make_shared<const Function>(Function{std::move(name), std::move(fn)});
  return v;
}

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (equals(k, key)) return &v;
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& [k, v] : entries) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Namespace::get_attr(const std::string& name) {
  if (const Value* v = attrs.find(Value::string(name))) return *v;
  return Value::undefined("'" + repr() + "' has no attribute '" + name + "'");
}

bool Namespace::set_attr(const std::string& name, const Value& value) {
  attrs.set(Value::string(name), value);
  return true;
}

std::string Namespace::repr() const { return "<Namespace " + jinja::repr(Value::dict(attrs)) + ">"; }

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return "Undefined";
    case Value::Type::None: return "NoneType";
    case Value::Type::Bool: return "bool";
    case Value::Type::Int: return "int";
    case Value::Type::Float: return "float";
    case Value::Type::String: return v.is_markup() ? "Markup" : "str";
    case Value::Type::List: return v.is_tuple() ? "tuple" : "list";
    case Value::Type::Dict: return "dict";
    case Value::Type::Object: return v.obj()->type_name();
    case Value::Type::Function: return "function";
  }
  return "object";
}

void fail_undefined(const Value& v) {
  throw TemplateError(v.str().empty() ? std::string("value is undefined") : v.str());
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then CPython's layout rule: exponent form when the decimal
  // point position is < -3 or > 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp10 = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  int nd = static_cast<int>(digits.size());
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= nd) {
      out = digits + std::string(decpt - nd, '0') + ".0";
    } else {
      out = digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out = digits.substr(0, 1);
    if (nd > 1) out += "." + digits.substr(1);
    int x = decpt - 1;
    char eb[16];
    snprintf(eb, sizeof eb, "e%c%02d", x < 0 ? '-' : '+', std::abs(x));
    out += eb;
  }
  return sign + out;
}

std::string to_str(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return "";
    case Value::Type::String: return v.str();
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return "Undefined";
    case Value::Type::None: return "None";
    case Value::Type::Bool: return v.as_bool() ? "True" : "False";
    case Value::Type::Int: return std::to_string(v.as_int());
    case Value::Type::Float: return float_repr(v.as_double());
    case Value::Type::String: {
      std::string r = pystr::repr(v.str());
      return v.is_markup() ? "Markup(" + r + ")" : r;
    }
    case Value::Type::List: {
      std::string out = v.is_tuple() ? "(" : "[";
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += repr(items[i]);
      }
      if (v.is_tuple() && items.size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Value::Type::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().entries) {
        if (!first) out += ", ";
        first = false;
        out += repr(k) + ": " + repr(val);
      }
      return out + "}";
    }
    case Value::Type::Object: {
      if (repr_depth > static_cast<int>(Value::kMaxNesting)) throw TemplateError("maximum recursion depth exceeded in repr");
      struct Depth {  // counts this call until it returns or throws
        Depth() { ++repr_depth; }
        ~Depth() { --repr_depth; }
      } depth;
      return v.obj()->repr();
    }
    case Value::Type::Function: return "<function " + v.fn().name + ">";
  }
  return "";
}

bool truthy(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined:
    case Value::Type::None: return false;
    case Value::Type::Bool:
    case Value::Type::Int: return v.as_int() != 0;
    case Value::Type::Float: return v.as_double() != 0.0;
    case Value::Type::String: return !v.str().empty();
    case Value::Type::List: return !v.items().empty();
    case Value::Type::Dict: return !v.dict().entries.empty();
    default: return true;
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::Undefined:
    case Value::Type::None: return true;
    case Value::Type::String: return a.str() == b.str();
    case Value::Type::List: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!equals(a.items()[i], b.items()[i])) return false;
      return true;
    }
    case Value::Type::Dict: {
      if (a.dict().entries.size() != b.dict().entries.size()) return false;
      for (const auto& [k, v] : a.dict().entries) {
        const Value* other = b.dict().find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case Value::Type::Object: return a.obj() == b.obj();
    case Value::Type::Function: return &a.fn() == &b.fn();
    default: return false;
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());  // UTF-8 byte order == code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  throw TemplateError(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
                      type_name(b) + "'");
}

namespace {

Value from_json_at(const nlohmann::ordered_json& j, uint32_t depth) {
  if (depth > Value::kMaxNesting) throw TemplateError("JSON nested too deeply (over 512 levels)");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json_at(x, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData d;
      d.entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.entries.emplace_back(Value::string(it.key()), from_json_at(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default: throw TemplateError("unsupported JSON value of type " + std::string(j.type_name()));
  }
}

void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  size_t i = 0;
  while (i < s.size()) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    if (b >= 0x20 && b < 0x7F && b != '"' && b != '\\') {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    size_t start = i;
    uint32_t c = kiln::utf8::decode(s, i);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c > 0xFFFF) {
        uint32_t v = c - 0x10000;
        snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        snprintf(buf, sizeof buf, "\\u%04x", c);
      }
      out += buf;
    } else {
      out.append(s, start, i - start);
    }
  }
  out += '"';
}

std::string json_key(const Value& k) {
  switch (k.type()) {
    case Value::Type::String: return k.str();
    case Value::Type::None: return "null";
    case Value::Type::Bool: return k.as_bool() ? "true" : "false";
    case Value::Type::Int: return std::to_string(k.as_int());
    case Value::Type::Float: return float_repr(k.as_double());
    default: throw TemplateError("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& opt, int level) {
  switch (v.type()) {
    case Value::Type::None: out += "null"; return;
    case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Type::Int: out += std::to_string(v.as_int()); return;
    case Value::Type::Float: {
      double f = v.as_double();
      if (std::isnan(f)) {
        out += "NaN";
      } else if (std::isinf(f)) {
        out += f < 0 ? "-Infinity" : "Infinity";
      } else {
        out += float_repr(f);
      }
      return;
    }
    case Value::Type::String: dump_string(out, v.str(), opt.ensure_ascii); return;
    case Value::Type::List:
    case Value::Type::Dict: break;
    default: throw TemplateError("Object of type " + type_name(v) + " is not JSON serializable");
  }
  bool is_list = v.is_list();
  size_t n = is_list ? v.items().size() : v.dict().entries.size();
  if (n == 0) {
    out += is_list ? "[]" : "{}";
    return;
  }
  std::string newline_indent;
  if (opt.indent) {
    newline_indent = "\n";
    for (int i = 0; i <= level; ++i) newline_indent += *opt.indent;
  }
  out += is_list ? '[' : '{';
  out += newline_indent;
  if (is_list) {
    for (size_t i = 0; i < n; ++i) {
      if (i) out += opt.item_sep + newline_indent;
      dump(out, v.items()[i], opt, level + 1);
    }
  } else {
    std::vector<std::pair<std::string, const Value*>> entries;
    for (const auto& [k, val] : v.dict().entries) entries.emplace_back(json_key(k), &val);
    if (opt.sort_keys) {
      for (const auto& [k, val] : v.dict().entries)
        if (!k.is_string()) throw TemplateError("'<' not supported between instances of dict keys of mixed types");
      std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) out += opt.item_sep + newline_indent;
      dump_string(out, entries[i].first, opt.ensure_ascii);
      out += opt.key_sep;
      dump(out, *entries[i].second, opt, level + 1);
    }
  }
  if (opt.indent) {
    out += "\n";
    for (int i = 0; i < level; ++i) out += *opt.indent;
  }
  out += is_list ? ']' : '}';
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

std::string json_dumps(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  dump(out, v, opt, 0);
  return out;
}

}  // namespace kiln::jinja
