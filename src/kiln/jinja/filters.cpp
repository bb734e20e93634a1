// jinja2's built-in filters with its argument names and defaults, plus transformers' tojson
// (json.dumps with ensure_ascii=False, indent, separators, sort_keys). Filters that return
// generators in jinja2 (map, select, unique, ...) return lists here.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kiln/jinja/builtins.h"
#include "kiln/jinja/strings.h"

namespace kiln::jinja {
namespace {

Value str_value(std::string s) { return Value::string(std::move(s)); }

// Counts and widths past this are refused: Python would try to build the result and run out of memory.
constexpr int64_t kMaxCount = int64_t{1} << 20;

int64_t bounded(const Value& v, const char* what) {
  int64_t n = v.as_int();
  if (n > kMaxCount) throw TemplateError(std::string(what) + " too large");
  return n;
}

// soft_str: str() that keeps Markup.
Value soft_str(const Value& v) { return v.is_string() ? v : Value::string(to_str(v)); }

// make_attrgetter: "a.b.0" looks up each part as an item (digits as ints).
Value lookup_path(const Value& item, const Value& attribute, const Value* fallback = nullptr) {
  Value v = item;
  if (attribute.is_string()) {
    static const std::string dot = ".";
    for (const auto& part : pystr::split(attribute.str(), &dot, -1)) {
      bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      v = get_item(v, digits ? Value::integer(std::stoll(part)) : Value::string(part));
      if (fallback && v.is_undefined()) v = *fallback;
    }
  } else if (!attribute.is_none()) {
    v = get_item(v, attribute);
    if (fallback && v.is_undefined()) v = *fallback;
  }
  return v;
}

Value ignore_case(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value::string(pystr::lower(v.str())) : v;
}

// The sort key of an item: one attribute path, or a list of them for "a,b".
Value sort_key(const Value& item, const Value* attribute, bool case_sensitive) {
  if (!attribute || attribute->is_none()) return ignore_case(item, case_sensitive);
  if (!attribute->is_string()) return ignore_case(lookup_path(item, *attribute), case_sensitive);
  std::string sep = ",";
  std::vector<Value> keys;
  for (const auto& part : pystr::split(attribute->str(), &sep, -1))
    keys.push_back(ignore_case(lookup_path(item, Value::string(part)), case_sensitive));
  return Value::list(std::move(keys));
}

std::vector<Value> sorted(std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? compare(keys[b], keys[a]) < 0 : compare(keys[a], keys[b]) < 0;
  });
  std::vector<Value> out;
  for (size_t i : order) out.push_back(items[i]);
  return out;
}

std::vector<Value> items_of(const Value& v) {
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict().entries) out.push_back(Value::list({k, val}, true));
  return out;
}

Value tojson(const Value& v, const CallArgs& args) {
  ArgBinder p("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions opt;
  opt.ensure_ascii = truthy(p.get_or(0, Value::boolean(false)));
  std::string indent;
  Value ind = p.get_or(1, Value::none());
  if (!ind.is_none()) {
    if (ind.is_string()) {
      indent = ind.str();
    } else if (ind.is_int() || ind.is_bool()) {
      indent = std::string(static_cast<size_t>(std::max<int64_t>(0, bounded(ind, "tojson indent"))), ' ');
    } else {
      throw TemplateError("tojson: indent must be an int or a string");
    }
    opt.indent = &indent;
    opt.item_sep = ",";
  }
  Value seps = p.get_or(2, Value::none());
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.items().size() != 2 || !seps.items()[0].is_string() || !seps.items()[1].is_string())
      throw TemplateError("tojson: separators must be a pair of strings");
    opt.item_sep = seps.items()[0].str();
    opt.key_sep = seps.items()[1].str();
  }
  opt.sort_keys = truthy(p.get_or(3, Value::boolean(false)));
  return str_value(json_dumps(v, opt));
}

Value indent_filter(const Value& s, const ArgBinder& p) {
  Value width = p.get_or(0, Value::integer(4));
  std::string ind =
      width.is_string() ? width.str() : std::string(static_cast<size_t>(std::max<int64_t>(0, bounded(width, "indent width"))), ' ');
  bool first = truthy(p.get_or(1, Value::boolean(false))), blank = truthy(p.get_or(2, Value::boolean(false)));
  if (s.is_undefined()) fail_undefined(s);
  if (!s.is_string()) throw TemplateError("unsupported operand type(s) for +=: '" + type_name(s) + "' and 'str'");
  std::vector<std::string> lines = pystr::splitlines(s.str() + "\n", false);
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) rv += "\n";
    if (i && (blank || !lines[i].empty())) rv += ind;
    rv += lines[i];
  }
  if (first) rv = ind + rv;
  return Value::string(rv, s.is_markup());
}

Value round_filter(const Value& v, const ArgBinder& p) {
  int64_t precision = p.get_or(0, Value::integer(0)).as_int();
  Value m = p.get_or(1, Value::string("common"));
  std::string method = m.is_string() ? m.str() : "";
  if (method != "common" && method != "ceil" && method != "floor")
    throw TemplateError("method must be common, ceil or floor");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) throw TemplateError("type " + type_name(v) + " doesn't define __round__ method");
  double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value::number(std::ceil(v.as_double() * scale) / scale);
  if (method == "floor") return Value::number(std::floor(v.as_double() * scale) / scale);
  if (!v.is_float() && precision >= 0) return Value::integer(v.as_int());
  double x = v.as_double();
  if (!std::isfinite(x)) return Value::number(x);
  if (precision >= 0 && precision < 300) {
    // printf rounds the exact binary value half-to-even, as CPython's round() does.
    char buf[1024];  // up to 309 integer digits + 299 decimals
    snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
    return Value::number(std::strtod(buf, nullptr));
  }
  return Value::number(std::nearbyint(x / std::pow(10.0, static_cast<double>(-precision))) *
                       std::pow(10.0, static_cast<double>(-precision)));
}

Value truncate_filter(const Value& v, const ArgBinder& p) {
  int64_t len = p.get_or(0, Value::integer(255)).as_int();
  bool killwords = truthy(p.get_or(1, Value::boolean(false)));
  std::u32string end = pystr::decode(to_str(p.get_or(2, Value::string("..."))));
  int64_t leeway = p.get_or(3, Value::integer(5)).as_int();
  if (len < static_cast<int64_t>(end.size())) throw TemplateError("expected length >= " + std::to_string(end.size()));
  // jinja2 measures and returns the value itself; only strings can actually be cut.
  if (length(v) <= len + leeway) return v;
  if (!v.is_string()) throw TemplateError("truncate: cannot cut a " + type_name(v));
  std::u32string s = pystr::decode(v.str());
  std::u32string head = s.substr(0, static_cast<size_t>(len - static_cast<int64_t>(end.size())));
  if (!killwords) {
    size_t sp = head.rfind(U' ');
    if (sp != std::u32string::npos) head = head.substr(0, sp);
  }
  return str_value(pystr::encode(head + end));
}

// select/reject/selectattr/rejectattr.
Value select_filter(const Value& v, const CallArgs& args, bool lookup_attr, bool keep) {
  if (!truthy(v)) return Value::list({});  // jinja2 yields nothing for a falsy value of any type
  size_t off = 0;
  Value attr;
  if (lookup_attr) {
    if (args.args.empty()) throw TemplateError("Missing parameter for attribute name");
    attr = args.args[0];
    off = 1;
  }
  std::vector<Value> out;
  for (const auto& item : iterate(v)) {
    Value x = lookup_attr ? lookup_path(item, attr) : item;
    bool pass;
    if (args.args.size() > off) {
      if (!args.args[off].is_string()) throw TemplateError("test name must be a string");
      CallArgs targs;
      targs.args.assign(args.args.begin() + static_cast<long>(off) + 1, args.args.end());
      targs.kwargs = args.kwargs;
      pass = apply_test(args.args[off].str(), x, targs);
    } else {
      pass = truthy(x);
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value map_filter(const Value& v, const CallArgs& args) {
  std::vector<Value> out;
  if (!truthy(v)) return Value::list({});  // as select: a falsy value maps to nothing
  if (args.args.empty()) {
    const Value *attribute = nullptr, *fallback = nullptr;
    for (const auto& [k, val] : args.kwargs) {
      if (k == "attribute") {
        attribute = &val;
      } else if (k == "default") {
        fallback = &val;
      } else {
        throw TemplateError("Unexpected keyword argument '" + k + "'");
      }
    }
    if (!attribute) throw TemplateError("map requires a filter argument");
    for (const auto& item : iterate(v))
      out.push_back(lookup_path(item, *attribute, fallback && !fallback->is_none() ? fallback : nullptr));
    return Value::list(std::move(out));
  }
  if (!args.args[0].is_string()) throw TemplateError("map: the filter name must be a string");
  CallArgs fargs;
  fargs.args.assign(args.args.begin() + 1, args.args.end());
  fargs.kwargs = args.kwargs;
  for (const auto& item : iterate(v)) out.push_back(apply_filter(args.args[0].str(), item, fargs));
  return Value::list(std::move(out));
}

Value min_max(const Value& v, const ArgBinder& p, bool want_max) {
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool cs = truthy(p.get_or(0, Value::boolean(false)));
  const Value* attribute = p.get(1);
  size_t best = 0;
  Value best_key = sort_key(items[0], attribute, cs);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(items[i], attribute, cs);
    if (want_max ? compare(best_key, k) < 0 : compare(k, best_key) < 0) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

}  // namespace

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args) {
  const std::string what = name;
  if (name == "tojson") return tojson(v, args);
  if (name == "map") return map_filter(v, args);
  if (name == "select" || name == "reject") return select_filter(v, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return select_filter(v, args, true, name == "selectattr");
  if (name == "format") {
    if (!args.args.empty() && !args.kwargs.empty())
      throw TemplateError("can't handle positional and keyword arguments at the same time");
    if (!args.kwargs.empty()) {
      DictData d;
      for (const auto& [k, val] : args.kwargs) d.set(Value::string(k), val);
      return str_value(percent_format(to_str(v), Value::dict(std::move(d))));
    }
    return str_value(percent_format(to_str(v), Value::list(args.args, true)));
  }
  if (name == "trim") {
    ArgBinder p(what, args, {"chars"});
    const Value* chars = p.get(0);
    if (chars && !chars->is_none() && !chars->is_string()) throw TemplateError("strip arg must be None or str");
    return str_value(pystr::strip(to_str(v), chars && chars->is_string() ? &chars->str() : nullptr, true, true));
  }
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "default" || name == "d") {
    ArgBinder p(what, args, {"default_value", "boolean"});
    bool boolean = truthy(p.get_or(1, Value::boolean(false)));
    if (v.is_undefined() || (boolean && !truthy(v))) return p.get_or(0, Value::string(""));
    return v;
  }
  if (name == "join") {
    ArgBinder p(what, args, {"d", "attribute"});
    std::string sep = to_str(p.get_or(0, Value::string(""))), out;
    bool first = true;
    for (const auto& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += to_str(p.get(1) && !p.get(1)->is_none() ? lookup_path(item, *p.get(1)) : item);
    }
    return str_value(std::move(out));
  }
  if (name == "upper") return str_value(pystr::upper(to_str(v)));
  if (name == "lower") return str_value(pystr::lower(to_str(v)));
  if (name == "capitalize") return str_value(pystr::capitalize(to_str(v)));
  if (name == "title") {
    // jinja2's own title: words start after runs of whitespace or -({[<.
    std::u32string s = pystr::decode(to_str(v)), out;
    bool word_start = true;
    for (char32_t c : s) {
      bool sep = pystr::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
      std::string one = pystr::encode(std::u32string(1, c));
      out += pystr::decode(sep ? one : word_start ? pystr::upper(one) : pystr::lower(one));
      word_start = sep;
    }
    return str_value(pystr::encode(out));
  }
  if (name == "string") return soft_str(v);
  if (name == "safe") return Value::string(to_str(v), true);
  if (name == "escape" || name == "e" || name == "forceescape") {
    if (v.is_markup() && name != "forceescape") return v;
    return Value::string(pystr::html_escape(to_str(v)), true);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::list({});
    if (!v.is_dict()) throw TemplateError("Can only get item pairs from a mapping.");
    return Value::list(items_of(v));
  }
  if (name == "dictsort") {
    ArgBinder p(what, args, {"case_sensitive", "by", "reverse"});
    if (!v.is_dict()) {
      if (v.is_undefined()) fail_undefined(v);
      throw TemplateError("'" + type_name(v) + "' object has no attribute 'items'");
    }
    bool cs = truthy(p.get_or(0, Value::boolean(false)));
    std::string by = to_str(p.get_or(1, Value::string("key")));
    if (by != "key" && by != "value") throw TemplateError("You can only sort by either \"key\" or \"value\"");
    std::vector<Value> items = items_of(v), keys;
    for (const auto& it : items) keys.push_back(ignore_case(it.items()[by == "key" ? 0 : 1], cs));
    return Value::list(sorted(items, keys, truthy(p.get_or(2, Value::boolean(false)))));
  }
  if (name == "sort") {
    ArgBinder p(what, args, {"reverse", "case_sensitive", "attribute"});
    std::vector<Value> items = iterate(v), keys;
    bool cs = truthy(p.get_or(1, Value::boolean(false)));
    for (const auto& it : items) keys.push_back(sort_key(it, p.get(2), cs));
    return Value::list(sorted(items, keys, truthy(p.get_or(0, Value::boolean(false)))));
  }
  if (name == "unique") {
    ArgBinder p(what, args, {"case_sensitive", "attribute"});
    bool cs = truthy(p.get_or(0, Value::boolean(false)));
    std::vector<Value> out, seen;
    for (const auto& item : iterate(v)) {
      Value key = ignore_case(p.get(1) && !p.get(1)->is_none() ? lookup_path(item, *p.get(1)) : item, cs);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "first" || name == "last") {
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(std::string("No ") + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::list(iterate(v));
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = pystr::decode(v.str());
      std::reverse(u.begin(), u.end());
      return str_value(pystr::encode(u));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "replace") {
    ArgBinder p(what, args, {"old", "new", "count"});
    if (!p.get(0) || !p.get(1)) throw TemplateError("replace() takes at least 2 arguments");
    Value count = p.get_or(2, Value::none());
    return str_value(pystr::replace(to_str(v), to_str(*p.get(0)), to_str(*p.get(1)), count.is_none() ? -1 : count.as_int()));
  }
  if (name == "int") {
    ArgBinder p(what, args, {"default", "base"});
    if (v.is_undefined()) fail_undefined(v);  // int(Undefined) raises in jinja2
    int64_t base = p.get_or(1, Value::integer(10)).as_int();
    if (v.is_string() && base != 10) {
      std::string s = pystr::strip(v.str(), nullptr, true, true);
      if (base < 2 || base > 36) throw TemplateError("int() base must be >= 2 and <= 36, or 0");
      char* end = nullptr;
      errno = 0;
      long long r = std::strtoll(s.c_str(), &end, static_cast<int>(base));
      if (errno == ERANGE) throw TemplateError("integer overflow (the interpreter's ints are 64-bit)");
      if (!s.empty() && end == s.c_str() + s.size()) return Value::integer(r);
    } else if (auto i = to_int(v)) {
      return Value::integer(*i);
    }
    if (auto f = to_float(v); f && std::isfinite(*f)) {
      if (std::fabs(*f) >= 9.2e18) throw TemplateError("integer overflow (the interpreter's ints are 64-bit)");
      return Value::integer(static_cast<int64_t>(std::trunc(*f)));
    }
    return p.get_or(0, Value::integer(0));
  }
  if (name == "float") {
    ArgBinder p(what, args, {"default"});
    if (v.is_undefined()) fail_undefined(v);
    if (auto f = to_float(v)) return Value::number(*f);
    return p.get_or(0, Value::number(0.0));
  }
  if (name == "abs") {
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_number()) throw TemplateError("bad operand type for abs(): '" + type_name(v) + "'");
    if (v.is_float()) return Value::number(std::fabs(v.as_double()));
    if (v.as_int() == INT64_MIN) throw TemplateError("integer overflow (the interpreter's ints are 64-bit)");
    return Value::integer(std::llabs(v.as_int()));
  }
  if (name == "round") return round_filter(v, ArgBinder(what, args, {"precision", "method"}));
  if (name == "indent") return indent_filter(v, ArgBinder(what, args, {"width", "first", "blank"}));
  if (name == "truncate") return truncate_filter(v, ArgBinder(what, args, {"length", "killwords", "end", "leeway"}));
  if (name == "wordcount") return Value::integer(pystr::word_count(to_str(v)));
  if (name == "center") {
    ArgBinder p(what, args, {"width"});
    return str_value(pystr::pad(to_str(v), p.get_or(0, Value::integer(80)).as_int(), U' ', '^'));
  }
  if (name == "min" || name == "max") return min_max(v, ArgBinder(what, args, {"case_sensitive", "attribute"}), name == "max");
  if (name == "sum") {
    ArgBinder p(what, args, {"attribute", "start"});
    Value total = p.get_or(1, Value::integer(0));
    for (const auto& item : iterate(v)) {
      Value x = p.get(0) && !p.get(0)->is_none() ? lookup_path(item, *p.get(0)) : item;
      if (x.is_string()) throw TemplateError("unsupported operand type(s) for +: '" + type_name(total) + "' and 'str'");
      total = binary_op("+", total, x);
    }
    return total;
  }
  if (name == "attr") {
    ArgBinder p(what, args, {"name"});
    if (!p.get(0) || !p.get(0)->is_string()) return Value::undefined("attr: the name must be a string");
    Value a = v.is_dict() ? Value::undefined() : get_attribute(v, p.get(0)->str());
    return a.is_undefined() ? Value::undefined("'" + type_name(v) + " object' has no attribute '" + p.get(0)->str() + "'") : a;
  }
  if (name == "batch" || name == "slice") {
    ArgBinder p(what, args, {"count", "fill_with"});
    if (!p.get(0) || !(p.get(0)->is_int())) throw TemplateError(name + ": the count must be an integer");
    int64_t n = bounded(*p.get(0), name.c_str());
    if (n <= 0) throw TemplateError(name + ": the count must be positive");
    const Value* fill = p.get(1) && !p.get(1)->is_none() ? p.get(1) : nullptr;
    std::vector<Value> items = iterate(v), out, cur;
    if (name == "batch") {
      for (const auto& item : items) {
        cur.push_back(item);
        if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::list(std::exchange(cur, {})));
      }
      if (!cur.empty()) {
        while (fill && static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
        out.push_back(Value::list(cur));
      }
      return Value::list(std::move(out));
    }
    int64_t len = static_cast<int64_t>(items.size()), per = len / n, extra = len % n, offset = 0;
    for (int64_t s = 0; s < n; ++s) {
      int64_t start = offset + s * per;
      if (s < extra) ++offset;
      int64_t end = offset + (s + 1) * per;
      std::vector<Value> part(items.begin() + start, items.begin() + end);
      if (fill && s >= extra) part.push_back(*fill);
      out.push_back(Value::list(std::move(part)));
    }
    return Value::list(std::move(out));
  }
  throw TemplateError("unsupported filter '" + name + "'");
}

}  // namespace kiln::jinja
