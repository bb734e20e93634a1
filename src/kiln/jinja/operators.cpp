// Jinja operators with Python semantics: arithmetic on int/float (ints stay exact, overflow is
// an error instead of a silent wrap), str/list concatenation and repetition, `in`, comparisons,
// iteration, len(), int() and float().
#include <cmath>
#include <cstdlib>

#include "kiln/jinja/builtins.h"
#include "kiln/jinja/strings.h"

namespace kiln::jinja {
namespace {

[[noreturn]] void unsupported_operands(const std::string& op, const Value& a, const Value& b) {
  throw TemplateError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

[[noreturn]] void overflow() { throw TemplateError("integer overflow (the interpreter's ints are 64-bit)"); }

// a op b on int64 with overflow detection (op: '+', '-', '*').
int64_t checked(char op, int64_t a, int64_t b) {
  int64_t r = 0;
  bool o = op == '+' ? __builtin_add_overflow(a, b, &r) : op == '-' ? __builtin_sub_overflow(a, b, &r)
                                                                    : __builtin_mul_overflow(a, b, &r);
  if (o) overflow();
  return r;
}

// Python's floor division and modulo for ints (results round toward -inf).
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t floor_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

Value repeat(const Value& seq, int64_t n) {
  size_t unit = seq.is_string() ? seq.str().size() : seq.items().size() * 16;
  if (n > 0 && unit > 0 && static_cast<uint64_t>(n) > (size_t{1} << 28) / unit)
    throw TemplateError("repetition result too large (over 256 MiB)");
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::string(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out), seq.is_tuple());
}

bool is_intlike(const Value& v) { return v.is_int() || v.is_bool(); }

std::string strip_ws(const std::string& s) { return pystr::strip(s, nullptr, true, true); }

constexpr size_t kMaxString = size_t{1} << 28;  // 256 MiB: a runaway template fails instead of exhausting memory

Value concat(std::string s, bool markup = false) {
  if (s.size() > kMaxString) throw TemplateError("string result too large (over 256 MiB)");
  return Value::string(std::move(s), markup);
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return concat(to_str(a) + to_str(b));
  if (op == "%" && a.is_string()) return concat(percent_format(a.str(), b));  // str.__mod__ takes any right side
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    bool flt = a.is_float() || b.is_float();
    int64_t x = a.as_int(), y = b.as_int();
    double fx = a.as_double(), fy = b.as_double();
    if (op == "+") return flt ? Value::number(fx + fy) : Value::integer(checked('+', x, y));
    if (op == "-") return flt ? Value::number(fx - fy) : Value::integer(checked('-', x, y));
    if (op == "*") return flt ? Value::number(fx * fy) : Value::integer(checked('*', x, y));
    if (op == "/") {
      if (fy == 0) throw TemplateError("division by zero");
      return Value::number(fx / fy);
    }
    if (op == "//") {
      if (fy == 0) throw TemplateError(flt ? "float floor division by zero" : "integer division or modulo by zero");
      if (!flt) {
        if (x == INT64_MIN && y == -1) overflow();
        return Value::integer(floor_div(x, y));
      }
      return Value::number(std::floor(fx / fy));
    }
    if (op == "%") {
      if (fy == 0) throw TemplateError(flt ? "float modulo" : "integer division or modulo by zero");
      if (!flt) return Value::integer(y == -1 ? 0 : floor_mod(x, y));
      double m = std::fmod(fx, fy);
      if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
      return Value::number(m);
    }
    if (op == "**") {
      if (!flt && y >= 0) {
        int64_t acc = 1, base = x;
        for (int64_t e = y; e > 0; e >>= 1) {
          if (e & 1) acc = checked('*', acc, base);
          if (e > 1) base = checked('*', base, base);
        }
        return Value::integer(acc);
      }
      if (fx == 0 && fy < 0) throw TemplateError("0.0 cannot be raised to a negative power");
      return Value::number(std::pow(fx, fy));
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup()) {
        std::string l = a.is_markup() ? a.str() : pystr::html_escape(a.str());
        std::string rr = b.is_markup() ? b.str() : pystr::html_escape(b.str());
        return concat(l + rr, true);
      }
      return concat(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(out), a.is_tuple());
    }
    if (a.is_string() || a.is_list())
      throw TemplateError("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && is_intlike(b)) return repeat(a, b.as_int());
    if (is_intlike(a) && (b.is_string() || b.is_list())) return repeat(b, a.as_int());
  }
  unsupported_operands(op, a, b);
}

Value unary_op(const std::string& op, const Value& a) {
  if (a.is_undefined()) fail_undefined(a);
  if (!a.is_number()) throw TemplateError("bad operand type for unary " + op + ": '" + type_name(a) + "'");
  if (op == "+") return a.is_float() ? a : Value::integer(a.as_int());
  if (a.is_float()) return Value::number(-a.as_double());
  if (a.as_int() == INT64_MIN) overflow();
  return Value::integer(-a.as_int());
}

bool contains(const Value& haystack, const Value& needle) {
  switch (haystack.type()) {
    case Value::Type::String:
      if (!needle.is_string())
        throw TemplateError("'in <string>' requires string as left operand, not " + type_name(needle));
      return haystack.str().find(needle.str()) != std::string::npos;
    case Value::Type::List:
      for (const auto& x : haystack.items())
        if (equals(x, needle)) return true;
      return false;
    case Value::Type::Dict: return haystack.dict().find(needle) != nullptr;
    case Value::Type::Undefined: return false;
    default: throw TemplateError("argument of type '" + type_name(haystack) + "' is not iterable");
  }
}

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  int c = compare(a, b, op.c_str());
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;  // ">="
}

std::vector<Value> iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::List: return v.items();
    case Value::Type::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().entries.size());
      for (const auto& [k, val] : v.dict().entries) keys.push_back(k);
      return keys;
    }
    case Value::Type::String: {
      std::vector<Value> chars;
      for (char32_t c : pystr::decode(v.str())) chars.push_back(Value::string(pystr::encode(std::u32string(1, c))));
      return chars;
    }
    case Value::Type::Undefined: return {};
    default: throw TemplateError("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.type()) {
    case Value::Type::String: return static_cast<int64_t>(pystr::length(v.str()));
    case Value::Type::List: return static_cast<int64_t>(v.items().size());
    case Value::Type::Dict: return static_cast<int64_t>(v.dict().entries.size());
    case Value::Type::Undefined: return 0;
    default: throw TemplateError("object of type '" + type_name(v) + "' has no len()");
  }
}

std::optional<int64_t> to_int(const Value& v) {
  if (v.is_bool() || v.is_int()) return v.as_int();
  if (v.is_float()) {
    double f = v.as_double();
    if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return std::nullopt;
    return static_cast<int64_t>(std::trunc(f));
  }
  if (!v.is_string()) return std::nullopt;
  std::string s = strip_ws(v.str()), digits;
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  for (; i < s.size(); ++i) {
    if (s[i] >= '0' && s[i] <= '9') {
      digits += s[i];
    } else if (s[i] == '_' && !digits.empty() && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') {
      continue;
    } else {
      return std::nullopt;
    }
  }
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t r = std::strtoll(digits.c_str(), nullptr, 10);
  return neg ? -r : r;
}

std::optional<double> to_float(const Value& v) {
  if (v.is_number()) return v.as_double();
  if (!v.is_string()) return std::nullopt;
  std::string s = strip_ws(v.str()), clean;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_') continue;
    if (c == 'x' || c == 'X' || c == 'p' || c == 'P') return std::nullopt;  // no hex floats in Python
    clean += c;
  }
  if (clean.empty()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;  // also rejects embedded NULs
  return d;
}

}  // namespace kiln::jinja
