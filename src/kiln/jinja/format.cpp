// Python string formatting for templates: format(value, spec) with the format-spec mini
// language, str.format() fields ({}, {0}, {name}, {0.attr}, {0[key]}, !r/!s, :spec) and
// printf-style `fmt % args` (%s %r %d %i %f %e %g %x %o %c with flags, width, precision).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kiln/base/utf8.h"
#include "kiln/jinja/builtins.h"
#include "kiln/jinja/strings.h"

namespace kiln::jinja {
namespace {

// Widths and precisions past this are refused (Python would try to build the string).
constexpr int64_t kMaxWidth = 1 << 20;

struct Spec {
  char32_t fill = U' ';
  char align = 0;   // < > ^ = ; 0: type default
  char sign = '-';  // - + ' '
  bool alt = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;  // , or _
  int64_t precision = -1;
  char type = 0;
};

bool is_align(char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; }

// The decimal number at s[i] (i moves past it), -1 when there is none; over kMaxWidth throws `too_big`.
template <typename S>
int64_t read_width(const S& s, size_t& i, const char* too_big) {
  int64_t v = -1;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    v = (v < 0 ? 0 : v * 10) + (s[i++] - '0');
    if (v > kMaxWidth) throw TemplateError(too_big);
  }
  return v;
}

Spec parse_spec(const std::string& spec_text) {
  Spec s;
  std::u32string u = pystr::decode(spec_text);
  size_t i = 0;
  if (u.size() >= 2 && is_align(u[1])) {
    s.fill = u[0];
    s.align = static_cast<char>(u[1]);
    i = 2;
  } else if (!u.empty() && is_align(u[0])) {
    s.align = static_cast<char>(u[0]);
    i = 1;
  }
  if (i < u.size() && (u[i] == '+' || u[i] == '-' || u[i] == ' ')) s.sign = static_cast<char>(u[i++]);
  if (i < u.size() && u[i] == 'z') ++i;
  if (i < u.size() && u[i] == '#') {
    s.alt = true;
    ++i;
  }
  if (i < u.size() && u[i] == '0') {
    s.zero = true;
    ++i;
  }
  const char* too_many = "Too many decimal digits in format string";
  s.width = read_width(u, i, too_many);
  if (i < u.size() && (u[i] == ',' || u[i] == '_')) s.grouping = static_cast<char>(u[i++]);
  if (i < u.size() && u[i] == '.') {
    ++i;
    s.precision = read_width(u, i, too_many);
    if (s.precision < 0) throw TemplateError("Format specifier missing precision");
  }
  if (i < u.size()) s.type = static_cast<char>(u[i++]);
  if (i != u.size()) throw TemplateError("Invalid format specifier '" + spec_text + "'");
  return s;
}

std::string group_digits(const std::string& digits, char sep) {
  if (!sep) return digits;
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i && (n - i) % 3 == 0) out += sep;
    out += digits[i];
  }
  return out;
}

// Pads sign+body to the width; '=' puts the padding between the sign and the digits.
std::string pad(const std::string& sign, const std::string& body, const Spec& s, char default_align) {
  char align = s.align ? s.align : (s.zero ? '=' : default_align);
  char32_t fill = (s.zero && !s.align) ? U'0' : s.fill;
  int64_t len = static_cast<int64_t>(pystr::length(sign) + pystr::length(body));
  if (s.width <= len) return sign + body;
  std::string f;
  kiln::utf8::append(f, fill);
  int64_t marg = s.width - len, left = 0;
  if (align == '>' || align == '=') left = marg;
  if (align == '^') left = marg / 2;
  std::string lpad, rpad;
  for (int64_t k = 0; k < left; ++k) lpad += f;
  for (int64_t k = 0; k < marg - left; ++k) rpad += f;
  if (align == '=') return sign + lpad + body;
  return lpad + sign + body + rpad;
}

std::string sign_of(bool negative, char sign) {
  if (negative) return "-";
  if (sign == '+') return "+";
  if (sign == ' ') return " ";
  return "";
}

std::string format_int(int64_t v, const Spec& s) {
  bool neg = v < 0;
  uint64_t mag = neg ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits, prefix;
  char t = s.type ? s.type : 'd';
  if (t == 'd' || t == 'n') {
    digits = group_digits(std::to_string(mag), s.grouping);
  } else if (t == 'x' || t == 'X' || t == 'o' || t == 'b') {
    int base = t == 'o' ? 8 : t == 'b' ? 2 : 16;
    const char* set = t == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
    do {
      digits.insert(digits.begin(), set[mag % base]);
      mag /= base;
    } while (mag);
    if (s.alt) prefix = std::string("0") + (t == 'o' ? 'o' : t == 'b' ? 'b' : t);
  } else if (t == 'c') {
    std::string c;
    kiln::utf8::append(c, static_cast<uint32_t>(v));
    return pad("", c, s, '<');
  } else {
    throw TemplateError(std::string("Unknown format code '") + t + "' for object of type 'int'");
  }
  return pad(sign_of(neg, s.sign) + prefix, digits, s, '>');
}

// printf of one double with a precision, into a string of the size it needs.
std::string printf_double(const char* fmt, int precision, double x) {
  int n = std::snprintf(nullptr, 0, fmt, precision, x);
  std::string out(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, precision, x);
  out.resize(static_cast<size_t>(std::max(n, 0)));
  return out;
}

std::string format_float(double v, const Spec& s) {
  char t = s.type;
  bool neg = std::signbit(v) && !std::isnan(v);
  double mag = std::fabs(v);
  std::string body;
  if (t == 0 && s.precision < 0) {
    body = float_repr(mag);
  } else if (t == '%') {
    body = printf_double(s.alt ? "%#.*f" : "%.*f", static_cast<int>(s.precision < 0 ? 6 : s.precision), mag * 100) + "%";
  } else if (t == 0 || t == 'g' || t == 'G' || t == 'n') {
    int p = static_cast<int>(s.precision < 0 ? 6 : s.precision == 0 ? 1 : s.precision);
    body = printf_double(s.alt ? (t == 'G' ? "%#.*G" : "%#.*g") : (t == 'G' ? "%.*G" : "%.*g"), p, mag);
    // No type: like 'g' but a fixed-point result keeps one digit after the point.
    if (t == 0 && std::isfinite(mag) && body.find_first_of(".e") == std::string::npos) body += ".0";
  } else if (t == 'e' || t == 'E' || t == 'f' || t == 'F') {
    char f[8] = {'%', '.', '*', t, 0};
    if (s.alt) snprintf(f, sizeof f, "%%#.*%c", t);
    body = printf_double(f, static_cast<int>(s.precision < 0 ? 6 : s.precision), mag);
  } else {
    throw TemplateError(std::string("Unknown format code '") + t + "' for object of type 'float'");
  }
  if (s.grouping && std::isfinite(mag)) {
    size_t end = body.find_first_not_of("0123456789");
    if (end == std::string::npos) end = body.size();
    body = group_digits(body.substr(0, end), s.grouping) + body.substr(end);
  }
  return pad(sign_of(neg, s.sign), body, s, '>');
}

// Resolves a str.format field name: "", "0", "name", "0.attr", "name[key]".
Value resolve_field(const std::string& field, const CallArgs& args, int64_t& auto_index, bool& manual) {
  size_t end = field.find_first_of(".[");
  std::string head = field.substr(0, end);
  Value v;
  if (head.empty() || head.find_first_not_of("0123456789") == std::string::npos) {
    int64_t idx;
    if (head.empty()) {
      if (manual && auto_index == 0) throw TemplateError("cannot switch from manual field specification to automatic field numbering");
      idx = auto_index++;
    } else {
      if (auto_index > 0) throw TemplateError("cannot switch from automatic field numbering to manual field specification");
      manual = true;
      idx = std::stoll(head);
    }
    if (idx >= static_cast<int64_t>(args.args.size()))
      throw TemplateError("Replacement index " + std::to_string(idx) + " out of range for positional args tuple");
    v = args.args[static_cast<size_t>(idx)];
  } else {
    bool found = false;
    for (const auto& [k, val] : args.kwargs) {
      if (k == head) {
        v = val;
        found = true;
      }
    }
    if (!found) throw TemplateError("KeyError: '" + head + "'");
  }
  size_t i = end;
  while (i != std::string::npos && i < field.size()) {
    if (field[i] == '.') {
      size_t j = field.find_first_of(".[", i + 1);
      v = get_attribute(v, field.substr(i + 1, j == std::string::npos ? std::string::npos : j - i - 1));
      i = j;
    } else {
      size_t j = field.find(']', i);
      if (j == std::string::npos) throw TemplateError("Missing ']' in format string");
      std::string key = field.substr(i + 1, j - i - 1);
      bool numeric = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
      v = get_item(v, numeric ? Value::integer(std::stoll(key)) : Value::string(key));
      i = j + 1;
    }
  }
  return v;
}

}  // namespace

std::string format_value(const Value& v, const std::string& spec_text) {
  if (spec_text.empty()) return to_str(v);
  Spec s = parse_spec(spec_text);
  switch (v.type()) {
    case Value::Type::String: {
      if (s.type && s.type != 's') throw TemplateError(std::string("Unknown format code '") + s.type + "' for object of type 'str'");
      std::string body = v.str();
      if (s.precision >= 0) {
        std::u32string u = pystr::decode(body);
        if (static_cast<int64_t>(u.size()) > s.precision) body = pystr::encode(u.substr(0, static_cast<size_t>(s.precision)));
      }
      if (s.align == '=') throw TemplateError("'=' alignment not allowed in string format specifier");
      return pad("", body, s, '<');
    }
    case Value::Type::Bool:
    case Value::Type::Int:
      if (s.type && std::string("eEfFgG%").find(s.type) != std::string::npos) return format_float(v.as_double(), s);
      return format_int(v.as_int(), s);
    case Value::Type::Float: return format_float(v.as_double(), s);
    default: throw TemplateError("unsupported format string passed to " + type_name(v) + ".__format__");
  }
}

std::string str_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  int64_t auto_index = 0;
  bool manual = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      throw TemplateError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    // The field runs to the matching '}' (one level of nested {} inside the spec).
    size_t j = i + 1;
    int depth = 1;
    for (; j < fmt.size(); ++j) {
      if (fmt[j] == '{') ++depth;
      if (fmt[j] == '}' && --depth == 0) break;
    }
    if (j >= fmt.size()) throw TemplateError("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, j - i - 1), spec;
    char conv = 0;
    size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
      if (spec.find('{') != std::string::npos) spec = str_format(spec, args);
    }
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size()) throw TemplateError("expected ':' after conversion specifier");
      conv = field[bang + 1];
      field.resize(bang);
    }
    Value v = resolve_field(field, args, auto_index, manual);
    if (conv == 'r' || conv == 'a') {
      v = Value::string(repr(v));
    } else if (conv == 's') {
      v = Value::string(to_str(v));
    } else if (conv) {
      throw TemplateError(std::string("Unknown conversion specifier ") + conv);
    }
    out += format_value(v, spec);
    i = j;
  }
  return out;
}

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> list = args.is_tuple() ? args.items() : std::vector<Value>{args};
  size_t next = 0;
  bool used_mapping = false;
  auto take = [&]() -> Value {
    if (next >= list.size()) throw TemplateError("not enough arguments for format string");
    return list[next++];
  };
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw TemplateError("incomplete format");
    std::optional<Value> mapped;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) throw TemplateError("incomplete format key");
      if (args.is_undefined()) fail_undefined(args);
      if (!args.is_dict()) throw TemplateError("format requires a mapping");
      const Value* v = args.dict().find(Value::string(fmt.substr(i + 1, close - i - 1)));
      if (!v) throw TemplateError("KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
      mapped = *v;
      used_mapping = true;
      i = close + 1;
    }
    Spec s;
    bool left = false;
    for (; i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos; ++i) {
      if (fmt[i] == '-') left = true;
      if (fmt[i] == '+') s.sign = '+';
      if (fmt[i] == ' ' && s.sign != '+') s.sign = ' ';
      if (fmt[i] == '#') s.alt = true;
      if (fmt[i] == '0') s.zero = true;
    }
    auto read_num = [&]() -> int64_t {
      if (i < fmt.size() && fmt[i] == '*') {
        ++i;
        Value w = take();
        if (!w.is_int()) throw TemplateError("* wants int");
        if (w.as_int() > kMaxWidth) throw TemplateError("width too big");
        return w.as_int();
      }
      return read_width(fmt, i, "width too big");
    };
    s.width = read_num();
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      s.precision = std::max<int64_t>(0, read_num());
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw TemplateError("incomplete format");
    char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    Value v = mapped ? *mapped : take();
    if (left) {
      s.align = '<';
      s.zero = false;
    }
    if (conv == 's' || conv == 'r' || conv == 'a') {
      std::string text = conv == 's' ? to_str(v) : repr(v);
      if (s.precision >= 0) text = pystr::encode(pystr::decode(text).substr(0, static_cast<size_t>(s.precision)));
      s.zero = false;
      out += pad("", text, s, '>');
    } else if (conv == 'd' || conv == 'i' || conv == 'u' || conv == 'x' || conv == 'X' || conv == 'o') {
      std::optional<int64_t> n = v.is_number() ? to_int(v) : std::nullopt;
      if (!n || (v.is_float() && conv != 'd' && conv != 'i' && conv != 'u'))
        throw TemplateError(std::string("%") + conv + " format: a real number is required, not " + type_name(v));
      s.type = (conv == 'i' || conv == 'u') ? 'd' : conv;
      std::string body = format_int(*n, Spec{U' ', 0, s.sign, s.alt, false, -1, 0, -1, s.type});
      if (s.precision >= 0) {
        std::string sign = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? body.substr(0, 1) : "";
        std::string digits = body.substr(sign.size());
        while (static_cast<int64_t>(digits.size()) < s.precision) digits.insert(digits.begin(), '0');
        body = sign + digits;
      }
      size_t sign_len = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
      out += pad(body.substr(0, sign_len), body.substr(sign_len), s, '>');
    } else if (std::string("eEfFgG").find(conv) != std::string::npos) {
      std::optional<double> f = v.is_number() ? to_float(v) : std::nullopt;
      if (!f) throw TemplateError("must be real number, not " + type_name(v));
      s.type = conv;
      if (s.precision < 0) s.precision = 6;
      out += format_float(*f, s);
    } else if (conv == 'c') {
      std::string ch = v.is_string() ? v.str() : "";
      if (v.is_int()) kiln::utf8::append(ch, static_cast<uint32_t>(v.as_int()));
      out += pad("", ch, s, '>');
    } else {
      throw TemplateError(std::string("unsupported format character '") + conv + "'");
    }
  }
  // CPython skips this check when the right side is subscriptable (dict, list, Undefined).
  bool mapping_like = args.is_dict() || (args.is_list() && !args.is_tuple()) || args.is_undefined();
  if (!used_mapping && !mapping_like && next < list.size())
    throw TemplateError("not all arguments converted during string formatting");
  return out;
}

}  // namespace kiln::jinja
