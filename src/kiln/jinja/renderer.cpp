// Renders a parsed template (see renderer.h). Scopes live in an arena owned by the render
// call, so macros and loop objects can point at their defining scope without reference cycles;
// everything is released when render() returns.
#include "kiln/jinja/renderer.h"

#include <deque>
#include <unordered_map>

#include "kiln/base/error.h"
#include "kiln/jinja/builtins.h"
#include "kiln/jinja/parser.h"

namespace kiln::jinja {
namespace {

constexpr int kMaxDepth = 200;                  // nested macro calls / recursive loops
constexpr int64_t kMaxIterations = 10'000'000;  // loop iterations per render (chat templates need thousands)

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
};

// The `loop` variable of a for-loop.
class LoopObject : public Object {
 public:
  std::vector<Value> items;
  size_t index = 0;
  int64_t depth0 = 0;
  std::function<Value(const CallArgs&)> recurse;  // set for `recursive` loops
  std::optional<Value> last_changed;

  std::string type_name() const override { return "LoopContext"; }
  bool callable() const override { return true; }
  Value call(const CallArgs& args) override {
    if (!recurse) throw TemplateError("The loop must have the 'recursive' marker to be called recursively.");
    return recurse(args);
  }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(index + 1) + "/" + std::to_string(items.size()) + ">";
  }
  Value get_attr(const std::string& name) override {
    auto n = static_cast<int64_t>(items.size()), i = static_cast<int64_t>(index);
    if (name == "index") return Value::integer(i + 1);
    if (name == "index0") return Value::integer(i);
    if (name == "revindex") return Value::integer(n - i);
    if (name == "revindex0") return Value::integer(n - i - 1);
    if (name == "first") return Value::boolean(i == 0);
    if (name == "last") return Value::boolean(i == n - 1);
    if (name == "length") return Value::integer(n);
    if (name == "depth") return Value::integer(depth0 + 1);
    if (name == "depth0") return Value::integer(depth0);
    if (name == "previtem") return i > 0 ? items[index - 1] : Value::undefined("there is no previous item");
    if (name == "nextitem") return i + 1 < n ? items[index + 1] : Value::undefined("there is no next item");
    if (name == "cycle") {
      return Value::function("loop.cycle", [this](const CallArgs& a) {
        if (a.args.empty()) throw TemplateError("no items for cycling given");
        return a.args[index % a.args.size()];
      });
    }
    if (name == "changed") {
      return Value::function("loop.changed", [this](const CallArgs& a) {
        Value now = Value::list(a.args, true);
        if (last_changed && equals(*last_changed, now)) return Value::boolean(false);
        last_changed = now;
        return Value::boolean(true);
      });
    }
    return Value::undefined("'LoopContext object' has no attribute '" + name + "'");
  }
};

class Renderer {
 public:
  enum class Flow { Normal, Break, Continue };

  // Namespaces are the only mutable values, so every reference cycle passes through one
  // (`set ns.me = ns`): emptying them all when the render ends frees everything.
  ~Renderer() {
    for (auto& ns : namespaces_) ns->attrs.entries.clear();
  }

  std::string run(const Body& body, const DictData& context) {
    Scope* globals = new_scope(nullptr);
    DictData g;
    add_globals(g);
    for (auto& [k, v] : g.entries) globals->vars[k.str()] = v;
    globals->vars["namespace"] = Value::function("namespace", [this](const CallArgs& a) {
      Value v = call_value(scopes_.front().vars.at("dict"), a);  // dict(*args, **kwargs)
      auto ns = std::make_shared<Namespace>();
      ns->attrs = v.dict();
      namespaces_.push_back(ns);
      return Value::object(ns);
    });
    Scope* root = new_scope(globals);
    for (const auto& [k, v] : context.entries) root->vars[to_str(k)] = v;
    std::string out;
    try {
      exec_body(body, root, out);
    } catch (const RaisedError& e) {
      kiln::fail("template", "raise_exception: {}", e.what());
    } catch (const TemplateError& e) {
      kiln::fail("template", "line {}: {}", line_, e.what());
    } catch (const std::logic_error& e) {  // std::stoll and friends on absurd input
      kiln::fail("template", "line {}: {}", line_, e.what());
    }
    return out;
  }

 private:
  Scope* new_scope(Scope* parent) {
    scopes_.emplace_back();
    scopes_.back().parent = parent;
    return &scopes_.back();
  }

  static Value lookup(const Scope* scope, const std::string& name) {
    for (const Scope* s = scope; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  // ---- statements ----

  Flow exec_body(const Body& body, Scope* scope, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec(*s, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  std::string render_body(const Body& body, Scope* scope) {
    std::string out;
    exec_body(body, new_scope(scope), out);
    return out;
  }

  Flow exec(const Stmt& s, Scope* scope, std::string& out) {
    line_ = s.line;
    switch (s.kind) {
      case StmtKind::Output: out += s.text; break;
      case StmtKind::Print: out += to_str(eval(*s.expr, scope)); break;
      case StmtKind::If:
        for (const auto& [test, body] : s.branches)
          if (truthy(eval(*test, scope))) return exec_body(body, scope, out);
        return exec_body(s.else_body, scope, out);
      case StmtKind::For: run_loop(s, eval(*s.expr, scope), scope, out, 0); break;
      case StmtKind::Set: assign(s.target, eval(*s.expr, scope), scope); break;
      case StmtKind::SetBlock: {
        Value v = Value::string(render_body(s.body, scope));
        assign(s.target, s.expr ? eval_filters(*s.expr, v, scope) : v, scope);
        break;
      }
      case StmtKind::Macro: scope->vars[s.text] = make_macro(s, scope); break;
      case StmtKind::CallBlock: {
        const Expr& call = *s.expr;
        CallArgs args = eval_args(call, scope);
        args.kwargs.emplace_back("caller", make_macro(s, scope));
        out += to_str(call_value(eval(*call.a, scope), args));
        break;
      }
      case StmtKind::FilterBlock:
        out += to_str(eval_filters(*s.expr, Value::string(render_body(s.body, scope)), scope));
        break;
      case StmtKind::With: {
        std::vector<Value> values;
        for (const auto& [t, e] : s.assigns) values.push_back(eval(*e, scope));
        Scope* inner = new_scope(scope);
        for (size_t i = 0; i < values.size(); ++i) assign(s.assigns[i].first, values[i], inner);
        return exec_body(s.body, inner, out);
      }
      case StmtKind::Scope: return exec_body(s.body, new_scope(scope), out);
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  void assign(const Target& t, const Value& v, Scope* scope) {
    switch (t.kind) {
      case Target::Kind::Name: scope->vars[t.name] = v; return;
      case Target::Kind::NsAttr: {
        Value ns = lookup(scope, t.name);
        if (!ns.is_object() || !ns.obj()->set_attr(t.attr, v))
          throw TemplateError("cannot assign attribute on non-namespace object");
        return;
      }
      case Target::Kind::Tuple: {
        if (v.is_undefined()) fail_undefined(v);
        std::vector<Value> items = iterate(v);
        size_t want = t.items.size();
        if (items.size() > want)
          throw TemplateError("too many values to unpack (expected " + std::to_string(want) + ")");
        if (items.size() < want) {
          throw TemplateError("not enough values to unpack (expected " + std::to_string(want) + ", got " +
                              std::to_string(items.size()) + ")");
        }
        for (size_t i = 0; i < want; ++i) assign(t.items[i], items[i], scope);
        return;
      }
    }
  }

  void run_loop(const Stmt& s, const Value& iterable, Scope* scope, std::string& out, int64_t depth0) {
    std::vector<Value> items = iterate(iterable);
    if (s.cond) {
      std::vector<Value> kept;
      for (const auto& item : items) {
        Scope* probe = new_scope(scope);
        assign(s.target, item, probe);
        if (truthy(eval(*s.cond, probe))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec_body(s.else_body, new_scope(scope), out);
      return;
    }
    auto loop = std::make_shared<LoopObject>();
    loop->items = items;
    loop->depth0 = depth0;
    if (s.recursive) {
      loop->recurse = [this, &s, scope, depth0](const CallArgs& a) {
        if (a.args.size() != 1 || !a.kwargs.empty()) throw TemplateError("loop() takes exactly one argument");
        DepthGuard guard(*this);
        std::string inner;
        run_loop(s, a.args[0], scope, inner, depth0 + 1);
        return Value::string(inner);
      };
    }
    Value loop_value = Value::object(loop);
    for (size_t i = 0; i < items.size(); ++i) {
      if (++iterations_ > kMaxIterations) throw TemplateError("the template ran more than 10000000 loop iterations");
      loop->index = i;
      Scope* iter_scope = new_scope(scope);
      assign(s.target, items[i], iter_scope);
      iter_scope->vars["loop"] = loop_value;
      if (exec_body(s.body, iter_scope, out) == Flow::Break) break;
    }
  }

  struct DepthGuard {
    explicit DepthGuard(Renderer& r) : r_(r) {
      if (++r_.depth_ > kMaxDepth) {
        --r_.depth_;
        throw TemplateError("maximum recursion depth exceeded");
      }
    }
    ~DepthGuard() { --r_.depth_; }
    Renderer& r_;
  };

  // A macro (or the caller of a call block) as a callable Value bound to its defining scope.
  Value make_macro(const Stmt& m, Scope* def_scope) {
    const char* kind = m.kind == StmtKind::Macro ? "macro" : "caller";
    std::string name = m.kind == StmtKind::Macro ? m.text : "caller";
    return Value::function(name, [this, &m, def_scope, kind, name](const CallArgs& args) {
      DepthGuard guard(*this);
      Scope* local = new_scope(def_scope);
      size_t np = m.params.size();
      if (args.args.size() > np && !m.uses_varargs) {
        throw TemplateError(std::string(kind) + " '" + name + "' takes not more than " + std::to_string(np) +
                            " argument(s)");
      }
      std::vector<bool> bound(np, false);
      for (size_t i = 0; i < np && i < args.args.size(); ++i) {
        local->vars[m.params[i]] = args.args[i];
        bound[i] = true;
      }
      DictData extra;
      Value caller = Value::undefined("No caller defined");
      for (const auto& [key, value] : args.kwargs) {
        size_t i = 0;
        while (i < np && m.params[i] != key) ++i;
        if (i < np) {
          if (bound[i]) throw TemplateError(std::string(kind) + " '" + name + "' got multiple values for argument '" + key + "'");
          local->vars[key] = value;
          bound[i] = true;
        } else if (key == "caller" && m.uses_caller) {
          caller = value;
        } else if (m.uses_kwargs) {
          extra.set(Value::string(key), value);
        } else {
          throw TemplateError(std::string(kind) + " '" + name + "' takes no keyword argument '" + key + "'");
        }
      }
      size_t first_default = np - m.defaults.size();
      for (size_t i = 0; i < np; ++i) {
        if (bound[i]) continue;
        local->vars[m.params[i]] = i >= first_default ? eval(*m.defaults[i - first_default], local)
                                                      : Value::undefined("parameter '" + m.params[i] + "' was not provided");
      }
      if (m.uses_varargs) {
        std::vector<Value> rest;
        for (size_t i = np; i < args.args.size(); ++i) rest.push_back(args.args[i]);
        local->vars["varargs"] = Value::list(std::move(rest), true);
      }
      if (m.uses_kwargs) local->vars["kwargs"] = Value::dict(std::move(extra));
      if (m.uses_caller) local->vars["caller"] = caller;
      std::string out;
      int saved = line_;
      exec_body(m.body, local, out);
      line_ = saved;
      return Value::string(std::move(out));
    });
  }

  // ---- expressions ----

  Value eval(const Expr& e, Scope* scope) {
    int saved = line_;
    line_ = e.line;
    Value v = eval_inner(e, scope);
    line_ = saved;  // not restored on a throw: the error reports the innermost line
    return v;
  }

  CallArgs eval_args(const Expr& e, Scope* scope) {
    CallArgs args;
    for (const auto& a : e.args) args.args.push_back(eval(*a, scope));
    if (e.dyn_args) {
      for (auto& v : iterate(eval(*e.dyn_args, scope))) args.args.push_back(std::move(v));
    }
    for (const auto& k : e.kwargs) args.kwargs.emplace_back(k.name, eval(*k.value, scope));
    if (e.dyn_kwargs) {
      Value d = eval(*e.dyn_kwargs, scope);
      if (!d.is_dict()) throw TemplateError("argument after ** must be a mapping, not " + type_name(d));
      for (const auto& [k, v] : d.dict().entries) {
        if (!k.is_string()) throw TemplateError("keywords must be strings");
        args.kwargs.emplace_back(k.str(), v);
      }
    }
    return args;
  }

  // A filter chain whose innermost operand is null (filter blocks, `set x | f`): applied to v.
  Value eval_filters(const Expr& e, const Value& v, Scope* scope) {
    Value operand = e.a ? eval_filters(*e.a, v, scope) : v;
    line_ = e.line;
    return apply_filter(e.name, operand, eval_args(e, scope));
  }

  Value eval_inner(const Expr& e, Scope* scope) {
    switch (e.kind) {
      case ExprKind::Const: return e.value;
      case ExprKind::Name: return lookup(scope, e.name);
      case ExprKind::Getattr: return get_attribute(eval(*e.a, scope), e.name);
      case ExprKind::Getitem: {
        Value obj = eval(*e.a, scope);
        if (e.b->kind == ExprKind::Slice) {
          const Expr& sl = *e.b;
          auto part = [&](const ExprPtr& p) { return p ? eval(*p, scope) : Value::none(); };
          return get_slice(obj, part(sl.a), part(sl.b), part(sl.c));
        }
        return get_item(obj, eval(*e.b, scope));
      }
      case ExprKind::Slice: throw TemplateError("a slice is only valid inside []");
      case ExprKind::Call:
      case ExprKind::Filter:
      case ExprKind::Test: {
        Value operand = eval(*e.a, scope);  // the callee of a Call
        CallArgs args = eval_args(e, scope);
        line_ = e.line;
        if (e.kind == ExprKind::Call) return call_value(operand, args);
        if (e.kind == ExprKind::Filter) return apply_filter(e.name, operand, args);
        return Value::boolean(apply_test(e.name, operand, args));
      }
      case ExprKind::Unary:
        if (e.name == "not") return Value::boolean(!truthy(eval(*e.a, scope)));
        return unary_op(e.name, eval(*e.a, scope));
      case ExprKind::Binary: {
        if (e.name == "and" || e.name == "or") {
          Value l = eval(*e.a, scope);
          if (truthy(l) == (e.name == "or")) return l;
          return eval(*e.b, scope);
        }
        Value l = eval(*e.a, scope);
        Value r = eval(*e.b, scope);
        line_ = e.line;
        return binary_op(e.name, l, r);
      }
      case ExprKind::Compare: {
        Value left = eval(*e.a, scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i], scope);
          line_ = e.line;
          if (!compare_op(e.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprKind::Cond:
        if (truthy(eval(*e.a, scope))) return eval(*e.b, scope);
        if (e.c) return eval(*e.c, scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      case ExprKind::List:
      case ExprKind::Tuple: {
        std::vector<Value> items;
        items.reserve(e.args.size());
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return Value::list(std::move(items), e.kind == ExprKind::Tuple);
      }
      case ExprKind::Dict: {
        DictData d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], scope);
          if (k.is_list() && !k.is_tuple()) throw TemplateError("unhashable type: 'list'");
          if (k.is_dict()) throw TemplateError("unhashable type: 'dict'");
          d.set(std::move(k), eval(*e.args[i + 1], scope));
        }
        return Value::dict(std::move(d));
      }
    }
    return Value();
  }

  std::deque<Scope> scopes_;
  std::vector<std::shared_ptr<Namespace>> namespaces_;
  int line_ = 0;
  int depth_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace

Template::Template(std::string_view source, const LexerOptions& options)
    : body_(std::make_shared<const Body>(parse_template(source, options))) {}

std::string Template::render(const DictData& context) const { return Renderer().run(*body_, context); }

}  // namespace kiln::jinja
