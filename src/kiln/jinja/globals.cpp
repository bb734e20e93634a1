// jinja2's tests (`x is defined`, `x is string`, ...) and the global functions a chat template
// can call: jinja2's range/dict/namespace and transformers' raise_exception/strftime_now.
#include <cstdlib>
#include <ctime>

#include "kiln/jinja/builtins.h"
#include "kiln/jinja/parser.h"
#include "kiln/jinja/strings.h"

namespace kiln::jinja {
namespace {

const Value& arg(const std::string& test, const CallArgs& args) {
  if (args.args.empty()) throw TemplateError("test '" + test + "' needs an argument");
  return args.args[0];
}

Value range_fn(const CallArgs& args) {
  ArgBinder p("range", args, {"start", "stop", "step"});
  auto as_int = [](const Value* v) {
    if (!v->is_int() && !v->is_bool())
      throw TemplateError("'" + type_name(*v) + "' object cannot be interpreted as an integer");
    return v->as_int();
  };
  if (!p.get(0)) throw TemplateError("range expected at least 1 argument, got 0");
  int64_t start = 0, stop, step = 1;
  if (p.get(1)) {
    start = as_int(p.get(0));
    stop = as_int(p.get(1));
    if (p.get(2)) step = as_int(p.get(2));
  } else {
    stop = as_int(p.get(0));
  }
  if (step == 0) throw TemplateError("range() arg 3 must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    if (out.size() >= 100000)
      throw TemplateError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    out.push_back(Value::integer(i));
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return Value::list(std::move(out));
}

// dict(mapping or pairs, **kwargs) — also the constructor of namespace() (the renderer's global).
DictData dict_from(const CallArgs& args) {
  if (args.args.size() > 1) throw TemplateError("dict expected at most 1 argument");
  DictData d;
  if (!args.args.empty()) {
    const Value& src = args.args[0];
    if (src.is_dict()) {
      d = src.dict();
    } else {
      for (const auto& pair : iterate(src)) {
        if (!pair.is_list() || pair.items().size() != 2)
          throw TemplateError("dictionary update sequence element has the wrong length; 2 is required");
        d.set(pair.items()[0], pair.items()[1]);
      }
    }
  }
  for (const auto& [k, v] : args.kwargs) d.set(Value::string(k), v);
  return d;
}

Value unsupported_fn(const std::string& name) {
  return Value::function(name, [name](const CallArgs&) -> Value {
    throw TemplateError("unsupported function '" + name + "'");
  });
}

}  // namespace

bool apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "iterable") {
    return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() || (v.is_object() && v.obj()->callable());
  }
  if (name == "callable") return v.is_function() || v.is_undefined() || (v.is_object() && v.obj()->callable());
  if (name == "escaped") return v.is_markup();
  if (name == "odd" || name == "even") {
    Value m = binary_op("%", v, Value::integer(2));
    return name == "odd" ? equals(m, Value::integer(1)) : equals(m, Value::integer(0));
  }
  if (name == "divisibleby") return equals(binary_op("%", v, arg(name, args)), Value::integer(0));
  if (name == "lower" || name == "upper") return pystr::all_cased(to_str(v), name == "upper");
  if (name == "in") return contains(arg(name, args), v);
  if (name == "sameas") {
    const Value& other = arg(name, args);
    if (v.type() != other.type()) return false;
    switch (v.type()) {
      case Value::Type::None:
      case Value::Type::Undefined: return v.is_none();
      case Value::Type::Bool: return v.as_bool() == other.as_bool();
      case Value::Type::Int: return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
      case Value::Type::List: return v.list_ptr() == other.list_ptr();
      case Value::Type::Object: return v.obj() == other.obj();
      default: return false;
    }
  }
  if (name == "eq" || name == "equalto") return compare_op("==", v, arg(name, args));
  if (name == "ne") return compare_op("!=", v, arg(name, args));
  if (name == "lt" || name == "lessthan") return compare_op("<", v, arg(name, args));
  if (name == "le") return compare_op("<=", v, arg(name, args));
  if (name == "gt" || name == "greaterthan") return compare_op(">", v, arg(name, args));
  if (name == "ge") return compare_op(">=", v, arg(name, args));
  if (name == "filter") return v.is_string() && is_jinja_filter(v.str());
  if (name == "test") return v.is_string() && is_jinja_test(v.str());
  throw TemplateError("unsupported test '" + name + "'");
}

std::string strftime_now(const std::string& format) {
  std::tm tm{};
  long micros = 0;
  const char* fake = std::getenv("KILN_FAKE_DATE");
  if (fake && *fake) {
    int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
    int n = std::sscanf(fake, "%d-%d-%d%*c%d:%d:%d", &y, &mo, &d, &h, &mi, &s);
    if (n < 3) throw TemplateError("KILN_FAKE_DATE must look like 2024-07-26 or 2024-07-26T09:30:00");
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = s;
    std::time_t t = timegm(&tm);  // fills tm_wday / tm_yday
    gmtime_r(&t, &tm);
  } else {
    std::timespec ts{};
    timespec_get(&ts, TIME_UTC);
    localtime_r(&ts.tv_sec, &tm);
    micros = ts.tv_nsec / 1000;
  }
  // Python's datetime.strftime handles %f, %z and %Z itself (a naive datetime has no zone).
  std::string fmt;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      char c = format[++i];
      if (c == 'f') {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%06ld", micros);
        fmt += buf;
      } else if (c != 'z' && c != 'Z') {
        fmt += '%';
        fmt += c;
      }
    } else {
      fmt += format[i];
    }
  }
  if (fmt.empty()) return "";
  std::string out(256 + fmt.size() * 8, '\0');
  size_t n = std::strftime(out.data(), out.size(), fmt.c_str(), &tm);
  out.resize(n);
  return out;
}

void add_globals(DictData& g) {
  g.set(Value::string("range"), Value::function("range", range_fn));
  g.set(Value::string("dict"), Value::function("dict", [](const CallArgs& a) { return Value::dict(dict_from(a)); }));
  for (const char* name : {"cycler", "joiner", "lipsum"}) g.set(Value::string(name), unsupported_fn(name));
  g.set(Value::string("raise_exception"), Value::function("raise_exception", [](const CallArgs& a) -> Value {
          ArgBinder p("raise_exception", a, {"message"});
          throw RaisedError(p.get(0) ? to_str(*p.get(0)) : std::string());
        }));
  g.set(Value::string("strftime_now"), Value::function("strftime_now", [](const CallArgs& a) {
          ArgBinder p("strftime_now", a, {"format"});
          if (!p.get(0) || !p.get(0)->is_string()) throw TemplateError("strftime_now() argument must be str");
          return Value::string(strftime_now(p.get(0)->str()));
        }));
}

}  // namespace kiln::jinja
