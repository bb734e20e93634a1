// Attribute and item access as jinja2's ImmutableSandboxedEnvironment does it (`x.name` tries
// the Python attribute first, so `d.items` is the method even when d has an "items" key), and
// the str/dict/list methods templates call. Mutating methods (list.append, dict.update, ...)
// are unsafe in the sandbox: they resolve to an Undefined that fails when used.
#include <set>

#include "kiln/jinja/builtins.h"
#include "kiln/jinja/strings.h"

namespace kiln::jinja {
namespace {

const std::set<std::string> kStrMethods = {
    "capitalize", "casefold", "center",  "count",      "encode",       "endswith",  "expandtabs", "find",
    "format",     "format_map", "index", "isalnum",    "isalpha",      "isascii",   "isdecimal",  "isdigit",
    "isidentifier", "islower", "isnumeric", "isprintable", "isspace",  "istitle",   "isupper",    "join",
    "ljust",      "lower",     "lstrip", "maketrans",  "partition",    "removeprefix", "removesuffix", "replace",
    "rfind",      "rindex",    "rjust",  "rpartition", "rsplit",       "rstrip",    "split",      "splitlines",
    "startswith", "strip",     "swapcase", "title",    "translate",    "upper",     "zfill"};
const std::set<std::string> kDictMethods = {"clear", "copy", "fromkeys", "get", "items", "keys",
                                            "pop",   "popitem", "setdefault", "update", "values"};
const std::set<std::string> kListMethods = {"append", "clear", "copy", "count", "extend", "index",
                                            "insert", "pop",   "remove", "reverse", "sort"};
const std::set<std::string> kUnsafe = {"clear", "pop", "popitem", "setdefault", "update", "append",
                                       "extend", "insert", "remove", "reverse", "sort"};

const std::string* opt_str(const Value* v, const char* what) {
  if (!v || v->is_none()) return nullptr;
  if (!v->is_string()) throw TemplateError(std::string(what) + " arg must be None or str");
  return &v->str();
}

int64_t opt_int(const Value* v, int64_t fallback) {
  if (!v || v->is_none()) return fallback;
  if (!v->is_int() && !v->is_bool()) throw TemplateError("'" + type_name(*v) + "' object cannot be interpreted as an integer");
  return v->as_int();
}

Value str_list(const std::vector<std::string>& parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Value::string(p));
  return Value::list(std::move(out));
}

template <typename Pred>
Value all_chars(const std::string& s, Pred pred) {
  std::u32string u = pystr::decode(s);
  if (u.empty()) return Value::boolean(false);
  for (char32_t c : u)
    if (!pred(c)) return Value::boolean(false);
  return Value::boolean(true);
}

// Code-point slice [start, end) of s with Python's index clamping.
std::string cp_range(const std::string& s, const Value* start, const Value* end) {
  if (!start && !end) return s;
  std::u32string u = pystr::decode(s);
  auto n = static_cast<int64_t>(u.size());
  auto clamp = [n](int64_t x) { return x < 0 ? std::max<int64_t>(0, x + n) : std::min(x, n); };
  int64_t b = clamp(opt_int(start, 0)), e = clamp(opt_int(end, n));
  return e > b ? pystr::encode(std::u32string_view(u).substr(b, e - b)) : std::string();
}

bool starts_or_ends(const std::string& s, const Value& affix, bool ends, const char* name) {
  auto test = [&](const Value& a) {
    if (!a.is_string())
      throw TemplateError(std::string(name) + " first arg must be str or a tuple of str, not " + type_name(a));
    const std::string& x = a.str();
    if (x.size() > s.size()) return false;
    return ends ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
  };
  if (affix.is_tuple()) {
    for (const auto& a : affix.items())
      if (test(a)) return true;
    return false;
  }
  return test(affix);
}

Value str_method(const std::string& s, const std::string& name, const CallArgs& args) {
  std::string what = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ArgBinder p(what, args, {"chars"});
    return Value::string(pystr::strip(s, opt_str(p.get(0), name.c_str()), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    ArgBinder p(what, args, {"sep", "maxsplit"});
    const std::string* sep = opt_str(p.get(0), name.c_str());
    if (sep && sep->empty()) throw TemplateError("empty separator");
    int64_t maxsplit = opt_int(p.get(1), -1);
    return str_list(name == "split" ? pystr::split(s, sep, maxsplit) : pystr::rsplit(s, sep, maxsplit));
  }
  if (name == "splitlines") {
    ArgBinder p(what, args, {"keepends"});
    return str_list(pystr::splitlines(s, truthy(p.get_or(0, Value::boolean(false)))));
  }
  if (name == "startswith" || name == "endswith") {
    ArgBinder p(what, args, {"affix", "start", "end"});
    if (!p.get(0)) throw TemplateError(name + "() takes at least 1 argument (0 given)");
    return Value::boolean(starts_or_ends(cp_range(s, p.get(1), p.get(2)), *p.get(0), name == "endswith", name.c_str()));
  }
  if (name == "replace") {
    ArgBinder p(what, args, {"old", "new", "count"});
    if (!p.get(0) || !p.get(1) || !p.get(0)->is_string() || !p.get(1)->is_string())
      throw TemplateError("replace() arguments must be str");
    return Value::string(pystr::replace(s, p.get(0)->str(), p.get(1)->str(), opt_int(p.get(2), -1)));
  }
  if (name == "upper") return Value::string(pystr::upper(s));
  if (name == "lower" || name == "casefold") return Value::string(pystr::lower(s));
  if (name == "title") return Value::string(pystr::title(s));
  if (name == "capitalize") return Value::string(pystr::capitalize(s));
  if (name == "swapcase") return Value::string(pystr::swapcase(s));
  if (name == "format") return Value::string(str_format(s, args));
  if (name == "join") {
    ArgBinder p(what, args, {"iterable"});
    if (!p.get(0)) throw TemplateError("join() takes exactly one argument (0 given)");
    std::string out;
    bool first = true;
    for (const auto& x : iterate(*p.get(0))) {
      if (!x.is_string()) throw TemplateError("sequence item: expected str instance, " + type_name(x) + " found");
      if (!first) out += s;
      first = false;
      out += x.str();
    }
    return Value::string(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    ArgBinder p(what, args, {"sub"});
    if (!p.get(0) || !p.get(0)->is_string()) throw TemplateError("must be str");
    if (name == "count") return Value::integer(pystr::count(s, p.get(0)->str()));
    int64_t at = pystr::find(s, p.get(0)->str(), name[0] == 'r');
    if (at < 0 && (name == "index" || name == "rindex")) throw TemplateError("substring not found");
    return Value::integer(at);
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    ArgBinder p(what, args, {"width", "fillchar"});
    int64_t width = opt_int(p.get(0), 0);
    if (name == "zfill") {
      std::string body = s, sign;
      if (!body.empty() && (body[0] == '-' || body[0] == '+')) {
        sign = body.substr(0, 1);
        body.erase(0, 1);
      }
      return Value::string(sign + pystr::pad(body, width - static_cast<int64_t>(sign.size()), U'0', '>'));
    }
    char32_t fill = U' ';
    if (const Value* f = p.get(1)) {
      std::u32string u = f->is_string() ? pystr::decode(f->str()) : U"";
      if (u.size() != 1) throw TemplateError("The fill character must be exactly one character long");
      fill = u[0];
    }
    return Value::string(pystr::pad(s, width, fill, name == "center" ? '^' : name == "ljust" ? '<' : '>'));
  }
  if (name == "partition" || name == "rpartition") {
    ArgBinder p(what, args, {"sep"});
    if (!p.get(0) || !p.get(0)->is_string() || p.get(0)->str().empty()) throw TemplateError("empty separator");
    const std::string& sep = p.get(0)->str();
    size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos) {
      return name == "partition" ? str_list({s, "", ""}) : str_list({"", "", s});
    }
    Value parts = str_list({s.substr(0, at), sep, s.substr(at + sep.size())});
    return Value::list(parts.items(), true);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    ArgBinder p(what, args, {"affix"});
    if (!p.get(0) || !p.get(0)->is_string()) throw TemplateError(name + "() argument must be str");
    const std::string& a = p.get(0)->str();
    if (name == "removeprefix") return Value::string(s.compare(0, a.size(), a) == 0 ? s.substr(a.size()) : s);
    bool ends = a.size() <= s.size() && s.compare(s.size() - a.size(), a.size(), a) == 0;
    return Value::string(ends ? s.substr(0, s.size() - a.size()) : s);
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") return all_chars(s, pystr::is_digit);
  if (name == "isalpha") return all_chars(s, pystr::is_alpha);
  if (name == "isalnum") return all_chars(s, pystr::is_alnum);
  if (name == "isspace") return all_chars(s, pystr::is_space);
  if (name == "isascii") {
    for (unsigned char c : s)
      if (c >= 128) return Value::boolean(false);
    return Value::boolean(true);
  }
  if (name == "isupper" || name == "islower") return Value::boolean(pystr::all_cased(s, name == "isupper"));
  throw TemplateError("unsupported method '" + what + "'");
}

Value dict_method(const Value& d, const std::string& name, const CallArgs& args) {
  std::string what = "dict." + name;
  if (name == "get") {
    ArgBinder p(what, args, {"key", "default"});
    if (!p.get(0)) throw TemplateError("get expected at least 1 argument, got 0");
    const Value* v = d.dict().find(*p.get(0));
    return v ? *v : p.get_or(1, Value::none());
  }
  ArgBinder p(what, args, {});
  if (name == "items") {
    std::vector<Value> out;
    for (const auto& [k, v] : d.dict().entries) out.push_back(Value::list({k, v}, true));
    return Value::list(std::move(out));
  }
  if (name == "keys") return Value::list(iterate(d));
  if (name == "values") {
    std::vector<Value> out;
    for (const auto& [k, v] : d.dict().entries) out.push_back(v);
    return Value::list(std::move(out));
  }
  if (name == "copy") return d;
  throw TemplateError("unsupported method '" + what + "'");
}

Value list_method(const Value& l, const std::string& name, const CallArgs& args) {
  std::string what = type_name(l) + "." + name;
  if (name == "copy") return Value::list(l.items(), l.is_tuple());
  ArgBinder p(what, args, {"value"});
  if (!p.get(0)) throw TemplateError(name + "() takes exactly one argument (0 given)");
  if (name == "count") {
    int64_t n = 0;
    for (const auto& x : l.items()) n += equals(x, *p.get(0));
    return Value::integer(n);
  }
  if (name == "index") {
    for (size_t i = 0; i < l.items().size(); ++i)
      if (equals(l.items()[i], *p.get(0))) return Value::integer(static_cast<int64_t>(i));
    throw TemplateError(repr(*p.get(0)) + " is not in list");
  }
  throw TemplateError("unsupported method '" + what + "'");
}

Value bound_method(const Value& obj, const std::string& name) {
  std::string owner = type_name(obj);
  if (kUnsafe.count(name))
    return Value::undefined("access to attribute '" + name + "' of '" + owner + "' object is unsafe.");
  return Value::function(owner + "." + name, [obj, name](const CallArgs& args) -> Value {
    if (obj.is_string()) return str_method(obj.str(), name, args);
    if (obj.is_dict()) return dict_method(obj, name, args);
    return list_method(obj, name, args);
  });
}

bool has_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return kStrMethods.count(name) > 0;
  if (obj.is_dict()) return kDictMethods.count(name) > 0;
  if (obj.is_tuple()) return name == "count" || name == "index";
  if (obj.is_list()) return kListMethods.count(name) > 0;
  return false;
}

std::string object_desc(const Value& obj) {
  if (obj.is_none()) return "None";
  std::string out = "'";  // appended piecewise: GCC 12 warns falsely (-Wrestrict) on a + chain here
  out += type_name(obj);
  out += " object'";
  return out;
}

}  // namespace

ArgBinder::ArgBinder(std::string what, const CallArgs& args, std::initializer_list<const char*> names)
    : what_(std::move(what)), bound_(names.size(), nullptr) {
  if (args.args.size() > names.size()) {
    throw TemplateError(what_ + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
                        std::to_string(args.args.size()) + " given)");
  }
  for (size_t i = 0; i < args.args.size(); ++i) bound_[i] = &args.args[i];
  for (const auto& [key, value] : args.kwargs) {
    size_t i = 0;
    for (const char* n : names) {
      if (key == n) break;
      ++i;
    }
    if (i == names.size()) throw TemplateError(what_ + "() got an unexpected keyword argument '" + key + "'");
    if (bound_[i]) throw TemplateError(what_ + "() got multiple values for argument '" + key + "'");
    bound_[i] = &value;
  }
}

Value get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (!name.empty() && name[0] == '_')
    return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.");
  if (has_method(obj, name)) return bound_method(obj, name);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(Value::string(name))) return *v;
  }
  if (obj.is_object()) return obj.obj()->get_attr(name);
  return Value::undefined(object_desc(obj) + " has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t n = length(obj), i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (obj.is_list()) return obj.items()[static_cast<size_t>(i)];
      std::u32string u = pystr::decode(obj.str());
      return Value::string(pystr::encode(std::u32string(1, u[static_cast<size_t>(i)])));
    }
    return Value::undefined(object_desc(obj) + " has no element " + std::to_string(key.as_int()));
  }
  if (key.is_string()) {
    if (obj.is_object()) return obj.obj()->get_attr(key.str());
    if (!key.str().empty() && key.str()[0] != '_' && has_method(obj, key.str())) return bound_method(obj, key.str());
    return Value::undefined(object_desc(obj) + " has no attribute '" + key.str() + "'");
  }
  return Value::undefined(object_desc(obj) + " has no element " + repr(key));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto bound = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int() && !v.is_bool())
      throw TemplateError("slice indices must be integers or None or have an __index__ method");
    return v.as_int();
  };
  std::optional<int64_t> st = bound(step);
  if (st && *st == 0) throw TemplateError("slice step cannot be zero");
  if (obj.is_list()) {
    std::vector<Value> out;
    for (int64_t i : pystr::slice_indices(length(obj), bound(start), bound(stop), st))
      out.push_back(obj.items()[static_cast<size_t>(i)]);
    return Value::list(std::move(out), obj.is_tuple());
  }
  if (obj.is_string()) {
    std::u32string u = pystr::decode(obj.str()), out;
    for (int64_t i : pystr::slice_indices(static_cast<int64_t>(u.size()), bound(start), bound(stop), st))
      out += u[static_cast<size_t>(i)];
    return Value::string(pystr::encode(out));
  }
  return Value::undefined(object_desc(obj) + " is not subscriptable with a slice");
}

Value call_value(const Value& callee, const CallArgs& args) {
  if (callee.is_function()) return callee.fn().call(args);
  if (callee.is_object() && callee.obj()->callable()) return callee.obj()->call(args);
  if (callee.is_undefined()) fail_undefined(callee);
  throw TemplateError("'" + type_name(callee) + "' object is not callable");
}

}  // namespace kiln::jinja
