// JSON Schema -> Grammar (json_schema.h). Leaf values (strings, numbers, literals, enums of them)
// are single terminals; objects, arrays, unions of non-leaves and $ref targets are rules. An object
// with properties p0..pn-1 in order is the chain R(i, first): property i (with a leading comma unless
// first) then R(i+1), or, when optional, just R(i+1, first); R(n) holds the additional properties.
#include "kiln/grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "kiln/base/error.h"
#include "kiln/base/utf8.h"

namespace kiln::grammar {

namespace {

using J = OrderedJson;

const std::set<std::string>& unsupported_keywords() {
  static const std::set<std::string> k = {"not", "if", "then", "else", "dependencies", "dependentRequired",
                                          "dependentSchemas", "uniqueItems", "multipleOf", "minProperties", "maxProperties",
                                          "contains", "minContains", "maxContains", "propertyNames", "unevaluatedProperties",
                                          "unevaluatedItems", "$dynamicRef", "$recursiveRef"};
  return k;
}

// Keywords whose meaning is "the value is of this kind" (used to infer a missing type).
const std::set<std::string>& object_keywords() {
  static const std::set<std::string> k = {"properties", "required", "additionalProperties", "patternProperties", "minProperties",
                                          "maxProperties", "propertyNames", "dependencies", "dependentRequired"};
  return k;
}
const std::set<std::string>& array_keywords() {
  static const std::set<std::string> k = {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains"};
  return k;
}
const std::set<std::string>& string_keywords() {
  static const std::set<std::string> k = {"minLength", "maxLength", "pattern", "format"};
  return k;
}
const std::set<std::string>& number_keywords() {
  static const std::set<std::string> k = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
  return k;
}

ReP json_escape() {
  static const ReP r = parse_regex("\\\\([\"\\\\/bfnrt]|u[0-9a-fA-F]{4})", false, false);
  return r;
}
ReP json_char() {
  static const ReP r = re_alt({re_codepoints(cp_negate({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}})), json_escape()});
  return r;
}
// A quoted property name other than `names` (a name spelled with escapes is not caught), as a DFA
// made directly: a byte trie of the names, each node knowing where the free string DFA would be,
// so leaving the trie anywhere continues as an ordinary string, and closing the quote on a whole
// name is the one transition that is missing.
ReP key_other_than(const std::vector<std::string>& names) {
  static const std::shared_ptr<const Dfa> D = cached_dfa(*re_concat({re_repeat(json_char(), 0, -1), re_byte('"')}));
  struct Node {
    std::map<uint8_t, int32_t> kids;
    bool terminal = false;
    int32_t f = 0;  // D's state after this prefix
  };
  std::vector<Node> nodes(1);
  for (const auto& n : names) {
    int32_t v = 0;
    bool ok = true;
    for (char ch : n) {
      uint8_t b = static_cast<uint8_t>(ch);
      auto it = nodes[v].kids.find(b);
      if (it != nodes[v].kids.end()) {
        v = it->second;
        continue;
      }
      int32_t f = D->step(nodes[v].f, b);
      if (f < 0 || b == '"') {
        ok = false;  // not plain string content: such a name is not excluded
        break;
      }
      nodes.push_back(Node{{}, false, f});
      int32_t id = static_cast<int32_t>(nodes.size() - 1);
      nodes[v].kids[b] = id;
      v = id;
    }
    if (ok) nodes[v].terminal = true;
  }
  auto d = std::make_shared<Dfa>();
  const int32_t N = static_cast<int32_t>(nodes.size()), O = 1 + N, n = O + D->n_states();
  d->n_cls = 256;
  for (int b = 0; b < 256; ++b) d->cls[b] = static_cast<uint8_t>(b);
  d->next.assign(static_cast<size_t>(n) * 256, -1);
  d->accepting.assign(n, 0);
  d->live.assign(n, 0);
  d->next['"'] = 1;
  for (int32_t i = 0; i < N; ++i) {
    for (int b = 0; b < 256; ++b) {
      auto it = nodes[i].kids.find(static_cast<uint8_t>(b));
      int32_t t;
      if (it != nodes[i].kids.end()) {
        t = 1 + it->second;
      } else {
        int32_t f = D->step(nodes[i].f, static_cast<uint8_t>(b));
        t = (f < 0 || (b == '"' && nodes[i].terminal)) ? -1 : O + f;
      }
      d->next[static_cast<size_t>(1 + i) * 256 + b] = t;
    }
  }
  for (int32_t s = 0; s < D->n_states(); ++s) {
    d->accepting[O + s] = D->accepting[s];
    for (int b = 0; b < 256; ++b) {
      int32_t t = D->step(s, static_cast<uint8_t>(b));
      d->next[static_cast<size_t>(O + s) * 256 + b] = t < 0 ? -1 : O + t;
    }
  }
  for (int32_t s = 0; s < n; ++s)
    for (int b = 0; b < 256 && !d->live[s]; ++b) d->live[s] = d->next[static_cast<size_t>(s) * 256 + b] >= 0;
  d->compress_classes();
  return re_built(std::move(d));
}

ReP json_string() {
  static const ReP r = re_concat({re_byte('"'), re_repeat(json_char(), 0, -1), re_byte('"')});
  return r;
}
// Exponents of at most two digits: a generated number stays finite as a double (JSON allows
// 1e999, which most parsers reject or read as infinity).
ReP json_number() {
  static const ReP r = parse_regex("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]{1,2})?", false, false);
  return r;
}
ReP json_nonneg_number() {
  static const ReP r = parse_regex("(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]{1,2})?", false, false);
  return r;
}
ReP json_integer() {
  static const ReP r = parse_regex("-?(0|[1-9][0-9]*)", false, false);
  return r;
}

// Decimal numerals of [a, b] (equal lengths, a <= b as strings), no sign.
ReP same_length(const std::string& a, const std::string& b) {
  if (a.empty()) return re_empty();
  if (a == b) return re_literal(a);
  size_t n = a.size();
  if (n == 1) return re_byte_range(static_cast<uint8_t>(a[0]), static_cast<uint8_t>(b[0]));
  if (a[0] == b[0]) return re_concat({re_byte(static_cast<uint8_t>(a[0])), same_length(a.substr(1), b.substr(1))});
  std::string nines(n - 1, '9'), zeros(n - 1, '0');
  std::vector<ReP> alts;
  alts.push_back(re_concat({re_byte(static_cast<uint8_t>(a[0])), same_length(a.substr(1), nines)}));
  if (a[0] + 1 <= b[0] - 1)
    alts.push_back(re_concat({re_byte_range(static_cast<uint8_t>(a[0] + 1), static_cast<uint8_t>(b[0] - 1)),
                              re_repeat(re_byte_range('0', '9'), static_cast<int>(n - 1), static_cast<int>(n - 1))}));
  alts.push_back(re_concat({re_byte(static_cast<uint8_t>(b[0])), same_length(zeros, b.substr(1))}));
  return re_alt(std::move(alts));
}

// Numerals of [lo, hi] without leading zeros, 0 <= lo; hi < 0: unbounded.
ReP nonneg_range(int64_t lo, int64_t hi) {
  std::string a = std::to_string(lo);
  std::vector<ReP> alts;
  size_t max_len = hi < 0 ? a.size() : std::to_string(hi).size();
  for (size_t len = a.size(); len <= max_len; ++len) {
    std::string from = a;
    if (len != a.size()) {
      from.assign(len, '0');
      from[0] = '1';
    }
    std::string to = (hi >= 0 && len == max_len) ? std::to_string(hi) : std::string(len, '9');
    alts.push_back(same_length(from, to));
  }
  if (hi < 0)  // anything longer
    alts.push_back(re_concat({re_byte_range('1', '9'), re_repeat(re_byte_range('0', '9'), static_cast<int>(a.size()), -1)}));
  return re_alt(std::move(alts));
}

class Converter {
 public:
  Converter(const J& root, const SchemaOptions& opt) : root_(root), opt_(opt) {}

  SchemaGrammar run() {
    int32_t start = g_.add_rule("root");
    Sym v = value(root_, "#", 0);
    g_.rules[start].alts = {{v}};
    g_.start = start;
    return SchemaGrammar{std::move(g_), std::move(warnings_)};
  }

  Sym any_object() {
    any_value();
    return Grammar::rule_sym(any_object_);
  }

 private:
  [[noreturn]] void error(const std::string& path, const std::string& what) const {
    fail("grammar", "json schema: {} at {}", printable(what), printable(path));
  }
  void unsupported(const std::string& path, const std::string& what) {
    if (opt_.strict) fail("grammar", "json schema: {} at {} is not supported (strict)", printable(what), printable(path));
    std::string w = printable(what) + " at " + printable(path) + " is not enforced";
    if (std::find(warnings_.begin(), warnings_.end(), w) == warnings_.end()) warnings_.push_back(w);
  }

  Sym lit(const std::string& s) { return g_.term(re_literal(s)); }
  // A structural character: alone when compact; with whitespace after { [ , : and before } ] , :
  // otherwise (so each gap between JSON tokens may hold whitespace, once).
  Sym P(const char* c) { return g_.term(P_re(c)); }
  ReP P_re(const char* c) const {
    if (!opt_.whitespace) return re_literal(c);
    static const ReP ws = parse_regex("[ \\t\\n\\r]*", false, false);
    std::vector<ReP> parts;
    if (std::strchr("}],:", c[0])) parts.push_back(ws);
    parts.push_back(re_literal(c));
    if (std::strchr("{[,:", c[0])) parts.push_back(ws);
    return re_concat(std::move(parts));
  }
  // A JSON value as written (enum, const): compact, or with the whitespace policy inside.
  ReP value_re(const J& x) const {
    if (!opt_.whitespace || !(x.is_object() || x.is_array()) || x.empty()) return re_literal(x.dump());
    std::vector<ReP> parts{P_re(x.is_object() ? "{" : "[")};
    bool first = true;
    for (auto it = x.begin(); it != x.end(); ++it) {
      if (!first) parts.push_back(P_re(","));
      first = false;
      if (x.is_object()) {
        parts.push_back(re_literal(J(it.key()).dump()));
        parts.push_back(P_re(":"));
      }
      parts.push_back(value_re(it.value()));
    }
    parts.push_back(P_re(x.is_object() ? "}" : "]"));
    return re_concat(std::move(parts));
  }
  Sym nothing() { return g_.term(re_bytes(ByteSet())); }
  Sym rule(std::string name, std::vector<std::vector<Sym>> alts) {
    int32_t r = g_.add_rule(std::move(name));
    g_.rules[r].alts = std::move(alts);
    return Grammar::rule_sym(r);
  }
  // One symbol for a union: a single terminal when every part is one, else a rule.
  Sym union_of(const std::vector<Sym>& parts, const std::string& name) {
    if (parts.empty()) return nothing();
    if (parts.size() == 1) return parts[0];
    bool terms = true;
    for (const Sym& s : parts) terms = terms && s.kind == Sym::Term;
    if (terms) {
      std::vector<ReP> res;
      for (const Sym& s : parts) res.push_back(g_.terms[s.id]);
      return g_.term(re_alt(std::move(res)));
    }
    std::vector<std::vector<Sym>> alts;
    for (const Sym& s : parts) alts.push_back({s});
    return rule(name, std::move(alts));
  }

  // Any JSON value: value ::= object | array | leaf.
  Sym any_value() {
    if (any_value_ < 0) {
      any_value_ = g_.add_rule("any");
      any_object_ = g_.add_rule("any_object");
      int32_t arr = g_.add_rule("any_array"), members = g_.add_rule("any_members"), elems = g_.add_rule("any_elems");
      Sym v = Grammar::rule_sym(any_value_);
      Sym leaf = g_.term(re_alt({json_string(), json_number(), re_literal("true"), re_literal("false"), re_literal("null")}));
      g_.rules[any_value_].alts = {{Grammar::rule_sym(any_object_)}, {Grammar::rule_sym(arr)}, {leaf}};
      Sym key = g_.term(json_string());
      g_.rules[members].alts = {{Grammar::rule_sym(members), P(","), key, P(":"), v}, {key, P(":"), v}};
      g_.rules[any_object_].alts = {{P("{"), P("}")}, {P("{"), Grammar::rule_sym(members), P("}")}};
      g_.rules[elems].alts = {{Grammar::rule_sym(elems), P(","), v}, {v}};
      g_.rules[arr].alts = {{P("["), P("]")}, {P("["), Grammar::rule_sym(elems), P("]")}};
    }
    return Grammar::rule_sym(any_value_);
  }

  const J* resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') error(path, "$ref \"" + ref + "\" is not a local reference (#...)");
    const J* cur = &root_;
    size_t i = 1;
    if (i < ref.size() && ref[i] != '/') error(path, "$ref \"" + ref + "\" names an anchor; only JSON pointers are supported");
    while (i < ref.size()) {
      size_t j = ref.find('/', i + 1);
      std::string tok = ref.substr(i + 1, (j == std::string::npos ? ref.size() : j) - i - 1);
      std::string t;
      for (size_t k = 0; k < tok.size(); ++k) {
        if (tok[k] == '~' && k + 1 < tok.size()) {
          t += tok[k + 1] == '1' ? '/' : '~';
          ++k;
        } else if (tok[k] == '%' && k + 2 < tok.size() && std::isxdigit(static_cast<unsigned char>(tok[k + 1])) &&
                   std::isxdigit(static_cast<unsigned char>(tok[k + 2]))) {
          t += static_cast<char>(std::stoi(tok.substr(k + 1, 2), nullptr, 16));
          k += 2;
        } else {
          t += tok[k];
        }
      }
      if (cur->is_object() && cur->contains(t)) {
        cur = &(*cur)[t];
      } else if (cur->is_array() && !t.empty() && std::all_of(t.begin(), t.end(), ::isdigit) && std::stoul(t) < cur->size()) {
        cur = &(*cur)[std::stoul(t)];
      } else {
        error(path, "$ref \"" + ref + "\" does not resolve");
      }
      i = j == std::string::npos ? ref.size() : j;
    }
    return cur;
  }

  // Keys that constrain values (the rest are annotations or unknown, which JSON Schema ignores).
  static bool is_constraint(const std::string& k) {
    static const std::set<std::string> handled = {
        "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
        "items", "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "nullable"};
    return handled.count(k) || unsupported_keywords().count(k);
  }
  static bool is_annotation_only(const J& s) {
    for (auto it = s.begin(); it != s.end(); ++it)
      if (is_constraint(it.key())) return false;
    return true;
  }

  // a ∧ b as one schema (allOf of objects, $ref with siblings).
  J merge(const J& a, const J& b, const std::string& path) {
    if (a.is_boolean() || b.is_boolean()) {
      if ((a.is_boolean() && !a.get<bool>()) || (b.is_boolean() && !b.get<bool>())) return J(false);
      return a.is_boolean() ? b : a;
    }
    J out = a;
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& k = it.key();
      const J& v = it.value();
      if (!out.contains(k)) {
        out[k] = v;
        continue;
      }
      J& o = out[k];
      if (k == "properties" && o.is_object() && v.is_object()) {
        for (auto p = v.begin(); p != v.end(); ++p) o[p.key()] = o.contains(p.key()) ? J{{"allOf", J::array({o[p.key()], p.value()})}} : p.value();
      } else if (k == "required" && o.is_array() && v.is_array()) {
        for (const auto& r : v)
          if (std::find(o.begin(), o.end(), r) == o.end()) o.push_back(r);
      } else if (k == "type") {
        auto types = [](const J& t) {
          std::set<std::string> s;
          if (t.is_string()) s.insert(t.get<std::string>());
          if (t.is_array())
            for (const auto& x : t)
              if (x.is_string()) s.insert(x.get<std::string>());
          return s;
        };
        auto ta = types(o), tb = types(v);
        J both = J::array();
        for (const auto& t : ta) {
          if (tb.count(t)) both.push_back(t);
          else if (t == "integer" && tb.count("number")) both.push_back("integer");
          else if (t == "number" && tb.count("integer")) both.push_back("integer");
        }
        o = both;
      } else if (k == "additionalProperties") {
        if (v.is_boolean() && !v.get<bool>()) o = false;
      } else if (k == "minimum" || k == "minLength" || k == "minItems") {
        if (v.is_number() && o.is_number() && v.get<double>() > o.get<double>()) o = v;
      } else if (k == "maximum" || k == "maxLength" || k == "maxItems") {
        if (v.is_number() && o.is_number() && v.get<double>() < o.get<double>()) o = v;
      } else if (k == "allOf" && o.is_array() && v.is_array()) {
        for (const auto& x : v) o.push_back(x);
      } else if (o != v && is_constraint(k)) {
        unsupported(path, "allOf with two different '" + k + "'");
      }
    }
    return out;
  }

  // The schema with allOf folded in and $ref (with siblings) merged, for merge().
  J flatten(const J& s, const std::string& path, int depth) {
    if (depth > 32) error(path, "allOf / $ref nesting too deep");
    if (!s.is_object()) return s;
    J out = s;
    if (out.contains("$ref") && out["$ref"].is_string()) {
      std::string ref = out["$ref"].get<std::string>();
      out.erase("$ref");
      out = merge(flatten(*resolve(ref, path), path, depth + 1), out, path);
      if (!out.is_object()) return out;
    }
    if (out.contains("allOf") && out["allOf"].is_array()) {
      J parts = out["allOf"];
      out.erase("allOf");
      for (size_t i = 0; i < parts.size(); ++i) {
        out = merge(out, flatten(parts[i], path + "/allOf/" + std::to_string(i), depth + 1), path);
        if (!out.is_object()) return out;
      }
    }
    return out;
  }

  Sym value(const J& s, const std::string& path, int depth) {
    if (depth > 200) error(path, "schema nesting too deep");
    if (s.is_boolean()) return s.get<bool>() ? any_value() : nothing();
    if (!s.is_object()) error(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (unsupported_keywords().count(it.key())) unsupported(path, "keyword '" + it.key() + "'");
    // $ref: a rule per target (recursion closes through it); siblings merge with the target.
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) error(path, "$ref must be a string");
      std::string ref = s["$ref"].get<std::string>();
      J rest = s;
      rest.erase("$ref");
      if (!is_annotation_only(rest)) return value(flatten(s, path, 0), path, depth + 1);
      auto it = refs_.find(ref);
      if (it != refs_.end()) return Grammar::rule_sym(it->second);
      const J* target = resolve(ref, path);
      int32_t r = g_.add_rule("ref " + ref);
      refs_.emplace(ref, r);
      Sym v = value(*target, ref, depth + 1);
      g_.rules[r].alts = {{v}};
      return Grammar::rule_sym(r);
    }
    if (s.contains("allOf")) {
      if (!s["allOf"].is_array()) error(path, "allOf must be an array");
      return value(flatten(s, path, 0), path, depth + 1);
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      const J& list = s[k];
      if (!list.is_array() || list.empty()) error(path, std::string(k) + " must be a non-empty array");
      J rest = s;
      rest.erase(k);
      bool plain = is_annotation_only(rest);
      std::vector<Sym> parts;
      for (size_t i = 0; i < list.size(); ++i) {
        std::string p = path + "/" + k + "/" + std::to_string(i);
        parts.push_back(plain ? value(list[i], p, depth + 1) : value(merge(rest, flatten(list[i], p, 0), p), p, depth + 1));
      }
      return union_of(parts, path + "/" + k);
    }
    Sym v = typed(s, path, depth);
    if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>()) v = union_of({v, lit("null")}, path + " nullable");
    return v;
  }

  // Whether value x has one of the schema's types (all when it names none).
  static bool of_type(const J& s, const J& x) {
    if (!s.contains("type")) return true;
    auto is = [&](const std::string& t) {
      if (t == "integer") return x.is_number_integer() || (x.is_number_float() && std::floor(x.get<double>()) == x.get<double>());
      if (t == "number") return x.is_number();
      if (t == "string") return x.is_string();
      if (t == "boolean") return x.is_boolean();
      if (t == "null") return x.is_null();
      if (t == "object") return x.is_object();
      if (t == "array") return x.is_array();
      return false;
    };
    const J& t = s["type"];
    if (t.is_string()) return is(t.get<std::string>());
    if (t.is_array())
      for (const auto& y : t)
        if (y.is_string() && is(y.get<std::string>())) return true;
    return false;
  }

  Sym typed(const J& s, const std::string& path, int depth) {
    if (s.contains("const")) return of_type(s, s["const"]) ? g_.term(value_re(s["const"])) : nothing();
    if (s.contains("enum")) {
      const J& e = s["enum"];
      if (!e.is_array()) error(path, "enum must be an array");
      std::vector<ReP> alts;
      for (const auto& x : e)
        if (of_type(s, x)) alts.push_back(value_re(x));
      if (alts.empty()) return nothing();
      return g_.term(re_alt(std::move(alts)));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const J& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array()) {
        for (const auto& x : t) {
          if (!x.is_string()) error(path, "type must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
        if (types.empty()) return nothing();
      } else {
        error(path, "type must be a string or a list of strings");
      }
    } else {
      // No type: the kinds its keywords constrain, else anything.
      auto has_any = [&](const std::set<std::string>& ks) {
        for (auto it = s.begin(); it != s.end(); ++it)
          if (ks.count(it.key())) return true;
        return false;
      };
      if (has_any(object_keywords())) types.push_back("object");
      if (has_any(array_keywords())) types.push_back("array");
      if (has_any(string_keywords())) types.push_back("string");
      if (has_any(number_keywords())) types.push_back("number");
      if (types.empty()) return any_value();
    }
    std::vector<Sym> parts;
    for (const auto& t : types) {
      if (t == "string") parts.push_back(string_value(s, path));
      else if (t == "integer") parts.push_back(integer_value(s, path));
      else if (t == "number") parts.push_back(number_value(s, path));
      else if (t == "boolean") parts.push_back(g_.term(re_alt({re_literal("true"), re_literal("false")})));
      else if (t == "null") parts.push_back(lit("null"));
      else if (t == "object") parts.push_back(object_value(s, path, depth));
      else if (t == "array") parts.push_back(array_value(s, path, depth));
      else error(path, "unknown type \"" + t + "\"");
    }
    return union_of(parts, path + " types");
  }

  static std::optional<double> num(const J& s, const char* k) {
    if (s.contains(k) && s[k].is_number()) return s[k].get<double>();
    return std::nullopt;
  }
  std::optional<int64_t> count(const J& s, const char* k, const std::string& path) {
    if (!s.contains(k)) return std::nullopt;
    if (!s[k].is_number() || s[k].get<double>() < 0) error(path, std::string(k) + " must be a non-negative number");
    return static_cast<int64_t>(s[k].get<double>());
  }

  Sym string_value(const J& s, const std::string& path) {
    auto min = count(s, "minLength", path), max = count(s, "maxLength", path);
    ReP content;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) error(path, "pattern must be a string");
      try {
        content = parse_regex(s["pattern"].get<std::string>(), /*search=*/true, /*json_string=*/true);
      } catch (const Error& e) {
        unsupported(path, std::string("pattern (") + e.what() + ")");
      }
      if (content && (min || max)) unsupported(path, "minLength/maxLength together with pattern");
      if (content && s.contains("format")) unsupported(path, "format together with pattern");
    } else if (s.contains("format") && s["format"].is_string()) {
      std::string f = s["format"].get<std::string>();
      static const char* date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
      static const char* time = "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
      std::string re;
      if (f == "date") re = date;
      else if (f == "time") re = time;
      else if (f == "date-time") re = std::string(date) + "[Tt ]" + time;
      else if (f == "uuid") re = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
      else if (f == "email")
        re = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
             "(\\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+";
      if (re.empty()) {
        unsupported(path, "format '" + f + "'");
      } else {
        content = parse_regex(re, false, true);
        if (min || max) unsupported(path, "minLength/maxLength together with format");
      }
    }
    if (!content) {
      int lo = static_cast<int>(std::min<int64_t>(min.value_or(0), 1000));
      int hi = -1;
      if (max) {
        if (*max > 1000) {
          unsupported(path, "maxLength over 1000");
        } else {
          hi = static_cast<int>(*max);
        }
      }
      if (min && *min > 1000) unsupported(path, "minLength over 1000");
      if (hi >= 0 && hi < lo) return nothing();
      content = (lo == 0 && hi < 0) ? re_repeat(json_char(), 0, -1) : re_repeat(json_char(), lo, hi);
    }
    return g_.term(re_concat({re_byte('"'), content, re_byte('"')}));
  }

  // Integer bounds: [lo, hi] (nullopt: unbounded).
  Sym integer_value(const J& s, const std::string& path) {
    std::optional<double> lo, hi;
    if (auto m = num(s, "minimum")) lo = std::ceil(*m);
    if (auto m = num(s, "maximum")) hi = std::floor(*m);
    if (s.contains("exclusiveMinimum")) {
      const J& e = s["exclusiveMinimum"];
      if (e.is_boolean() && e.get<bool>() && lo) lo = *lo + (std::ceil(*num(s, "minimum")) == *num(s, "minimum") ? 1 : 0);
      if (e.is_number()) lo = std::max(lo.value_or(-INFINITY), std::floor(e.get<double>()) + 1);
    }
    if (s.contains("exclusiveMaximum")) {
      const J& e = s["exclusiveMaximum"];
      if (e.is_boolean() && e.get<bool>() && hi) hi = *hi - (std::floor(*num(s, "maximum")) == *num(s, "maximum") ? 1 : 0);
      if (e.is_number()) hi = std::min(hi.value_or(INFINITY), std::ceil(e.get<double>()) - 1);
    }
    const double kMax = 1e15;
    if ((lo && std::fabs(*lo) > kMax) || (hi && std::fabs(*hi) > kMax)) {
      unsupported(path, "an integer bound beyond 1e15");
      if (lo && std::fabs(*lo) > kMax) lo.reset();
      if (hi && std::fabs(*hi) > kMax) hi.reset();
    }
    if (!lo && !hi) return g_.term(json_integer());
    if (lo && hi && *lo > *hi) return nothing();
    std::vector<ReP> alts;
    // Non-negative part [max(lo,0), hi].
    if (!hi || *hi >= 0) alts.push_back(nonneg_range(static_cast<int64_t>(std::max(lo.value_or(0), 0.0)), hi ? static_cast<int64_t>(*hi) : -1));
    // Negative part: -x for x in [max(1, -hi), -lo].
    if (!lo || *lo < 0) {
      int64_t xlo = hi && *hi < 0 ? static_cast<int64_t>(-*hi) : 1;
      alts.push_back(re_concat({re_byte('-'), nonneg_range(xlo, lo ? static_cast<int64_t>(-*lo) : -1)}));
    }
    return g_.term(re_alt(std::move(alts)));
  }

  Sym number_value(const J& s, const std::string& path) {
    auto lo = num(s, "minimum");
    bool nonneg = lo && *lo == 0;
    if (lo && *lo != 0) unsupported(path, "minimum of a number (not an integer)");
    if (s.contains("maximum")) unsupported(path, "maximum of a number (not an integer)");
    if (s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) unsupported(path, "exclusive bounds of a number");
    return g_.term(nonneg ? json_nonneg_number() : json_number());
  }

  Sym object_value(const J& s, const std::string& path, int depth) {
    struct Prop {
      std::string name;
      Sym value;
      bool required;
    };
    std::vector<Prop> props;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) error(path, "required must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) error(path, "required must list strings");
        required.insert(r.get<std::string>());
      }
    }
    std::set<std::string> seen;
    std::vector<std::string> names;
    if (s.contains("properties")) {
      const J& p = s["properties"];
      if (!p.is_object()) error(path, "properties must be an object");
      for (auto it = p.begin(); it != p.end(); ++it) {
        seen.insert(it.key());
        names.push_back(it.key());
        bool req = required.count(it.key()) > 0;
        if (it.value().is_boolean() && !it.value().get<bool>()) {
          if (req) return nothing();
          continue;
        }
        props.push_back({it.key(), value(it.value(), path + "/properties/" + it.key(), depth + 1), req});
      }
    }
    for (const auto& r : required)  // required but not described: any value
      if (!seen.count(r)) {
        props.push_back({r, any_value(), true});
        names.push_back(r);
      }
    // Other members: patternProperties (a key matching the pattern, its schema), then the additional
    // properties (a key other than the declared ones). A key matching a pattern is not kept from also
    // being declared or from taking the additional schema: both looser than JSON Schema, never stricter.
    std::vector<std::vector<Sym>> members;
    if (s.contains("patternProperties")) {
      const J& pp = s["patternProperties"];
      if (!pp.is_object()) error(path, "patternProperties must be an object");
      for (auto it = pp.begin(); it != pp.end(); ++it) {
        ReP key;
        try {
          key = re_concat({re_byte('"'), parse_regex(it.key(), /*search=*/true, /*json_string=*/true), re_byte('"')});
        } catch (const Error& e) {
          unsupported(path, std::string("patternProperties key (") + e.what() + ")");
          key = json_string();
        }
        if (it.value().is_boolean() && !it.value().get<bool>()) continue;
        members.push_back({g_.term(key), P(":"), value(it.value(), path + "/patternProperties/" + it.key(), depth + 1)});
      }
    }
    bool additional = opt_.additional_properties;
    if (s.contains("additionalProperties")) {
      const J& a = s["additionalProperties"];
      additional = !(a.is_boolean() && !a.get<bool>());
      if (additional) {
        // Extra keys differ from the declared ones (a skipped optional property is not an extra).
        Sym key = g_.term(names.empty() ? json_string() : key_other_than(names));
        members.push_back({key, P(":"), value(a, path + "/additionalProperties", depth + 1)});
      }
    } else if (additional) {
      members.push_back({g_.term(names.empty() ? json_string() : key_other_than(names)), P(":"), any_value()});
    }
    const std::string name = path;
    // R(n, first): the other members.
    std::vector<std::array<int32_t, 2>> chain(props.size() + 1, {-1, -1});
    auto tail = [&](bool first) -> Sym {
      if (members.empty()) return rule(name + " end", {{}});
      Sym member = rule(name + " extra", members);
      int32_t more = g_.add_rule(name + " extra*");  // ("," member)*
      g_.rules[more].alts = {{Grammar::rule_sym(more), P(","), member}, {}};
      if (!first) return Grammar::rule_sym(more);
      return rule(name + " extras", {{member, Grammar::rule_sym(more)}, {}});
    };
    std::function<Sym(size_t, bool)> R = [&](size_t i, bool first) -> Sym {
      int32_t& memo = chain[i][first];
      if (memo >= 0) return Grammar::rule_sym(memo);
      if (i == props.size()) {
        Sym t = tail(first);
        memo = t.id;
        return t;
      }
      const Prop& p = props[i];
      std::vector<std::vector<Sym>> alts;
      std::vector<Sym> seq;
      if (!first) seq.push_back(P(","));
      seq.push_back(lit(J(p.name).dump()));
      seq.push_back(P(":"));
      seq.push_back(p.value);
      seq.push_back(R(i + 1, false));
      alts.push_back(std::move(seq));
      if (!p.required) alts.push_back({R(i + 1, first)});
      Sym r = rule(name + " props" + std::to_string(i), std::move(alts));
      memo = r.id;
      return r;
    };
    Sym body = R(0, true);
    return rule(name + " object", {{P("{"), body, P("}")}});
  }

  Sym array_value(const J& s, const std::string& path, int depth) {
    std::vector<Sym> prefix;
    std::optional<Sym> rest;  // the schema of items past the prefix (none: no more items)
    const J* prefix_list = nullptr;
    const J* items = s.contains("items") ? &s["items"] : nullptr;
    if (s.contains("prefixItems")) {
      prefix_list = &s["prefixItems"];
    } else if (items && items->is_array()) {
      prefix_list = items;
      items = s.contains("additionalItems") ? &s["additionalItems"] : nullptr;
      if (!items) rest = any_value();
    }
    if (prefix_list) {
      if (!prefix_list->is_array()) error(path, "prefixItems must be an array");
      for (size_t i = 0; i < prefix_list->size(); ++i) prefix.push_back(value((*prefix_list)[i], path + "/prefixItems/" + std::to_string(i), depth + 1));
    }
    if (items) {
      if (!(items->is_boolean() && !items->get<bool>())) rest = value(*items, path + "/items", depth + 1);
      else rest.reset();
    } else if (!prefix_list) {
      rest = any_value();
    }
    int64_t min = count(s, "minItems", path).value_or(0);
    std::optional<int64_t> max = count(s, "maxItems", path);
    if (!rest) max = std::min<int64_t>(max.value_or(static_cast<int64_t>(prefix.size())), static_cast<int64_t>(prefix.size()));
    if (max && *max < min) return nothing();
    if (min > 1024 || (max && *max > 1024)) {
      unsupported(path, "minItems/maxItems over 1024");
      min = std::min<int64_t>(min, 1024);
      if (max && *max > 1024) max.reset();
    }
    // A(i): what may follow i items. Items i >= min are optional; past the prefix and past min,
    // an unbounded tail is one left-recursive rule.
    auto item = [&](int64_t i) { return i < static_cast<int64_t>(prefix.size()) ? prefix[i] : *rest; };
    std::map<int64_t, Sym> memo;
    std::function<Sym(int64_t)> A = [&](int64_t i) -> Sym {
      auto it = memo.find(i);
      if (it != memo.end()) return it->second;
      Sym out;
      if (max && i >= *max) {
        out = rule(path + " items end", {{}});
      } else if (i < min) {
        std::vector<Sym> seq;
        if (i) seq.push_back(P(","));
        seq.push_back(item(i));
        seq.push_back(A(i + 1));
        out = rule(path + " item" + std::to_string(i), {seq});
      } else if (!max && i >= static_cast<int64_t>(prefix.size())) {
        int32_t star = g_.add_rule(path + " items*");
        g_.rules[star].alts = {{Grammar::rule_sym(star), P(","), *rest}, {}};
        if (i == 0) {
          out = rule(path + " items", {{*rest, Grammar::rule_sym(star)}, {}});
        } else {
          out = Grammar::rule_sym(star);
        }
      } else {
        std::vector<Sym> seq;
        if (i) seq.push_back(P(","));
        seq.push_back(item(i));
        seq.push_back(A(i + 1));
        out = rule(path + " item" + std::to_string(i) + "?", {seq, {}});
      }
      memo.emplace(i, out);
      return out;
    };
    return rule(path + " array", {{P("["), A(0), P("]")}});
  }

  const J& root_;
  SchemaOptions opt_;
  Grammar g_;
  std::vector<std::string> warnings_;
  std::map<std::string, int32_t> refs_;
  int32_t any_value_ = -1, any_object_ = -1;
};

}  // namespace

SchemaGrammar json_schema_grammar(const OrderedJson& schema, const SchemaOptions& options) {
  return Converter(schema, options).run();
}

SchemaGrammar json_schema_grammar(const std::string& schema_text, const SchemaOptions& options) {
  return json_schema_grammar(parse_ordered_json(schema_text, "json schema", "grammar"), options);
}

Grammar json_object_grammar(const SchemaOptions& options) {
  OrderedJson s = {{"type", "object"}};
  return json_schema_grammar(s, options).grammar;
}

}  // namespace kiln::grammar
