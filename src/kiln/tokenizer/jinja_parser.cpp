// Jinja parser (see jinja_parser.h): a recursive-descent port of jinja2's grammar, including its
// quirks (`is` binds tighter than arithmetic, `-x|f` filters the negation, `if` tests do not
// take conditional expressions, a test argument may follow without parentheses).
#include "kiln/tokenizer/jinja_parser.h"

#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <set>

#include "kiln/base/error.h"

namespace kiln::tokenizer::jinja {
namespace {

const std::set<std::string> kFilters = {
    "abs",       "attr",     "batch",   "capitalize", "center",   "count",      "d",        "default",
    "dictsort",  "e",        "escape",  "filesizeformat", "first", "float",     "forceescape", "format",
    "groupby",   "indent",   "int",     "join",       "last",     "length",     "list",     "lower",
    "items",     "map",      "min",     "max",        "pprint",   "random",     "reject",   "rejectattr",
    "replace",   "reverse",  "round",   "safe",       "select",   "selectattr", "slice",    "sort",
    "string",    "striptags", "sum",    "title",      "trim",     "truncate",   "unique",   "upper",
    "urlencode", "urlize",   "wordcount", "wordwrap", "xmlattr",  "tojson"};

const std::set<std::string> kTests = {
    "odd",     "even",   "divisibleby", "defined",  "undefined", "filter",  "test",     "none",
    "boolean", "false",  "true",        "integer",  "float",     "mapping", "number",   "sequence",
    "iterable", "callable", "sameas",   "escaped",  "in",        "lower",   "upper",    "string",
    "eq",      "equalto", "ne",         "gt",       "greaterthan", "ge",    "lt",       "lessthan",
    "le"};

ExprPtr make(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

StmtPtr make_stmt(StmtKind kind, int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->line = line;
  return s;
}

const char* describe(const Token& t) {
  switch (t.type) {
    case TokenType::Data: return "template data";
    case TokenType::VarBegin: return "begin of print statement";
    case TokenType::VarEnd: return "end of print statement";
    case TokenType::BlockBegin: return "begin of statement block";
    case TokenType::BlockEnd: return "end of statement block";
    case TokenType::Eof: return "end of template";
    default: return t.value.c_str();
  }
}

// Finds loads of the names `caller`, `varargs`, `kwargs` inside a macro body.
struct SpecialNames {
  bool caller = false, varargs = false, kwargs = false;
  void expr(const Expr* e) {
    if (!e) return;
    if (e->kind == ExprKind::Name) {
      caller |= e->name == "caller";
      varargs |= e->name == "varargs";
      kwargs |= e->name == "kwargs";
    }
    expr(e->a.get());
    expr(e->b.get());
    expr(e->c.get());
    expr(e->dyn_args.get());
    expr(e->dyn_kwargs.get());
    for (const auto& x : e->args) expr(x.get());
    for (const auto& k : e->kwargs) expr(k.value.get());
  }
  void body(const Body& b) {
    for (const auto& s : b) stmt(*s);
  }
  void stmt(const Stmt& s) {
    expr(s.expr.get());
    expr(s.cond.get());
    for (const auto& [t, b] : s.branches) {
      expr(t.get());
      body(b);
    }
    for (const auto& d : s.defaults) expr(d.get());
    for (const auto& [t, v] : s.assigns) expr(v.get());
    body(s.body);
    body(s.else_body);
  }
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse() {
    Body body = subparse({});
    if (cur().type != TokenType::Eof) fail(cur().line, fmt::format("unexpected '{}'", describe(cur())));
    return body;
  }

 private:
  using Names = std::initializer_list<const char*>;

  const Token& cur() const { return toks_[pos_]; }
  const Token& look() const { return toks_[pos_ + 1 < toks_.size() ? pos_ + 1 : pos_]; }
  Token next() {
    Token t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op) const { return cur().type == TokenType::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == TokenType::Name && cur().value == n; }
  bool is_name_in(Names names) const {
    for (const char* n : names)
      if (is_name(n)) return true;
    return false;
  }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(int line, const std::string& msg) const { kiln::fail("template", "line {}: {}", line, msg); }
  [[noreturn]] void fail_expected(const std::string& what) const {
    if (cur().type == TokenType::Eof) fail(cur().line, fmt::format("unexpected end of template, expected '{}'", what));
    fail(cur().line, fmt::format("expected token '{}', got '{}'", what, describe(cur())));
  }
  void expect(TokenType t, const char* what) {
    if (cur().type != t) fail_expected(what);
    next();
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail_expected(op);
    next();
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) fail_expected("name");
    return next().value;
  }

  // ---- statements ----

  Body subparse(Names end_tokens) {
    Body body;
    while (cur().type != TokenType::Eof) {
      const Token& t = cur();
      if (t.type == TokenType::Data) {
        auto s = make_stmt(StmtKind::Output, t.line);
        s->text = t.value;
        body.push_back(std::move(s));
        next();
      } else if (t.type == TokenType::VarBegin) {
        next();
        auto s = make_stmt(StmtKind::Print, t.line);
        s->expr = parse_tuple(false, true, {}, false);
        expect(TokenType::VarEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (t.type == TokenType::BlockBegin) {
        next();
        if (end_tokens.size() && is_name_in(end_tokens)) return body;
        body.push_back(parse_statement());
        expect(TokenType::BlockEnd, "end of statement block");
      } else {
        fail(t.line, fmt::format("unexpected '{}'", describe(t)));
      }
    }
    return body;
  }

  Body parse_statements(Names end_tokens, bool drop_needle, const char* opener, int line) {
    skip_op(":");
    expect(TokenType::BlockEnd, "end of statement block");
    Body body = subparse(end_tokens);
    if (cur().type == TokenType::Eof) {
      std::string want;
      for (const char* n : end_tokens) want += (want.empty() ? "'" : " or '") + std::string(n) + "'";
      fail(line, fmt::format("unexpected end of template: '{}' is not closed (looking for {})", opener, want));
    }
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    Nest nest(*this, cur().line);
    if (cur().type != TokenType::Name) fail(cur().line, "tag name expected");
    const std::string tag = cur().value;
    int line = cur().line;
    if (tag == "for") return parse_for();
    if (tag == "if") return parse_if();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "call") return parse_call_block();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "print") {
      next();
      auto s = make_stmt(StmtKind::Scope, line);
      while (cur().type != TokenType::BlockEnd) {
        if (!s->body.empty()) expect_op(",");
        auto p = make_stmt(StmtKind::Print, line);
        p->expr = parse_expression(true);
        s->body.push_back(std::move(p));
      }
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(line, fmt::format("'{}' outside of a loop", tag));
      next();
      return make_stmt(tag == "break" ? StmtKind::Break : StmtKind::Continue, line);
    }
    if (tag == "generation") {
      next();
      auto s = make_stmt(StmtKind::Scope, line);
      s->body = parse_statements({"endgeneration"}, true, "generation", line);
      return s;
    }
    if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" || tag == "from" ||
        tag == "autoescape" || tag == "do") {
      fail(line, fmt::format("unsupported tag '{}'", tag));
    }
    fail(line, fmt::format("unknown tag '{}'", tag));
  }

  StmtPtr parse_for() {
    auto s = make_stmt(StmtKind::For, next().line);
    s->target = parse_assign_target(true, false, {"in"}, false);
    if (!skip_name("in")) fail_expected("in");
    s->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    s->recursive = skip_name("recursive");
    ++loop_depth_;
    s->body = parse_statements({"endfor", "else"}, false, "for", s->line);
    --loop_depth_;
    if (next().value != "endfor") s->else_body = parse_statements({"endfor"}, true, "for", s->line);
    return s;
  }

  StmtPtr parse_if() {
    auto s = make_stmt(StmtKind::If, next().line);
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"}, false, "if", s->line);
      s->branches.emplace_back(std::move(test), std::move(body));
      Token t = next();
      if (t.value == "elif") continue;
      if (t.value == "else") s->else_body = parse_statements({"endif"}, true, "if", s->line);
      break;
    }
    return s;
  }

  StmtPtr parse_set() {
    int line = next().line;
    Target target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto s = make_stmt(StmtKind::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, {}, false);
      return s;
    }
    auto s = make_stmt(StmtKind::SetBlock, line);
    s->target = std::move(target);
    if (is_op("|")) s->expr = parse_filter(nullptr, false);
    s->body = parse_statements({"endset"}, true, "set", line);
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      std::string name = expect_name();
      if (skip_op("=")) {
        s.defaults.push_back(parse_expression(true));
      } else if (!s.defaults.empty()) {
        fail(cur().line, "non-default argument follows default argument");
      }
      s.params.push_back(name);
    }
    expect_op(")");
  }

  void analyze(Stmt& s) {
    SpecialNames names;
    names.body(s.body);
    s.uses_caller = names.caller;
    s.uses_varargs = names.varargs;
    s.uses_kwargs = names.kwargs;
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(StmtKind::Macro, next().line);
    s->text = expect_name();
    parse_signature(*s);
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endmacro"}, true, "macro", s->line);
    loop_depth_ = saved;
    analyze(*s);
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = make_stmt(StmtKind::CallBlock, next().line);
    if (is_op("(")) parse_signature(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) fail(s->line, "expected call");
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endcall"}, true, "call", s->line);
    loop_depth_ = saved;
    analyze(*s);
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = make_stmt(StmtKind::FilterBlock, next().line);
    s->expr = parse_filter(nullptr, true);
    s->body = parse_statements({"endfilter"}, true, "filter", s->line);
    return s;
  }

  StmtPtr parse_with() {
    auto s = make_stmt(StmtKind::With, next().line);
    while (cur().type != TokenType::BlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      Target t = parse_assign_target(true, false, {}, false);
      expect_op("=");
      s->assigns.emplace_back(std::move(t), parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true, "with", s->line);
    return s;
  }

  Target to_target(const Expr& e) {
    Target t;
    if (e.kind == ExprKind::Name) {
      t.name = e.name;
      return t;
    }
    if (e.kind == ExprKind::Tuple) {
      t.kind = Target::Kind::Tuple;
      for (const auto& x : e.args) t.items.push_back(to_target(*x));
      return t;
    }
    fail(e.line, "can't assign to this expression");
  }

  Target parse_assign_target(bool with_tuple, bool name_only, Names extra_end, bool with_namespace) {
    if (with_namespace && look().type == TokenType::Op && look().value == ".") {
      Target t;
      t.kind = Target::Kind::NsAttr;
      t.name = expect_name();
      next();
      t.attr = expect_name();
      return t;
    }
    if (name_only) {
      Target t;
      t.name = expect_name();
      return t;
    }
    ExprPtr e = with_tuple ? parse_tuple(true, true, extra_end, false) : parse_primary();
    return to_target(*e);
  }

  // ---- expressions ----

  bool is_tuple_end(Names extra_end) const {
    if (cur().type == TokenType::VarEnd || cur().type == TokenType::BlockEnd || is_op(")")) return true;
    return extra_end.size() && is_name_in(extra_end);
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, Names extra_end, bool explicit_parens) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail(cur().line, fmt::format("expected an expression, got '{}'", describe(cur())));
    }
    auto t = make(ExprKind::Tuple, line);
    t->args = std::move(args);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr expr1 = parse_or();
    while (is_name("if")) {
      int line = next().line;
      auto c = make(ExprKind::Cond, line);
      c->a = parse_or();
      if (skip_name("else")) c->c = parse_condexpr();
      c->b = std::move(expr1);
      expr1 = std::move(c);
    }
    return expr1;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(ExprKind::Binary, line);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      int line = next().line;
      left = binary("or", std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      int line = next().line;
      left = binary("and", std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    Nest nest(*this, cur().line);
    if (is_name("not")) {
      auto e = make(ExprKind::Unary, next().line);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      if (cur().type == TokenType::Op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                          cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        ops.push_back(next().value);
      } else if (is_name("in")) {
        next();
        ops.push_back("in");
      } else if (is_name("not") && look().type == TokenType::Name && look().value == "in") {
        next();
        next();
        ops.push_back("notin");
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return expr;
    auto e = make(ExprKind::Compare, line);
    e->a = std::move(expr);
    e->ops = std::move(ops);
    e->args = std::move(operands);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      Token t = next();
      left = binary(t.value, std::move(left), parse_concat(), t.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      int line = next().line;
      left = binary("~", std::move(left), parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      Token t = next();
      left = binary(t.value, std::move(left), parse_pow(), t.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      int line = next().line;
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this, cur().line);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      Token t = next();
      node = make(ExprKind::Unary, t.line);
      node->name = t.value;
      node->a = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr constant(Value v, int line) {
    auto e = make(ExprKind::Const, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    switch (t.type) {
      case TokenType::Name: {
        std::string n = next().value;
        if (n == "true" || n == "True") return constant(Value::boolean(true), line);
        if (n == "false" || n == "False") return constant(Value::boolean(false), line);
        if (n == "none" || n == "None") return constant(Value::none(), line);
        auto e = make(ExprKind::Name, line);
        e->name = n;
        return e;
      }
      case TokenType::String: {
        std::string s;
        while (cur().type == TokenType::String) s += next().value;
        return constant(Value::string(std::move(s)), line);
      }
      case TokenType::Integer: {
        std::string digits = next().value;
        if (digits.size() > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos)
          fail(line, fmt::format("invalid integer literal '{}' (leading zeros)", digits));
        errno = 0;
        long long v = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(line, fmt::format("integer literal {} is too large", digits));
        return constant(Value::integer(v), line);
      }
      case TokenType::Float: return constant(Value::number(std::strtod(next().value.c_str(), nullptr)), line);
      case TokenType::Op:
        if (t.value == "(") {
          next();
          ExprPtr e = parse_tuple(false, true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default: break;
    }
    if (t.type == TokenType::Eof) fail(line, "unexpected end of template");
    fail(line, fmt::format("unexpected '{}'", describe(t)));
  }

  ExprPtr parse_list() {
    auto e = make(ExprKind::List, next().line);
    while (!is_op("]")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("]")) break;
      e->args.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make(ExprKind::Dict, next().line);
    while (!is_op("}")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("}")) break;
      e->args.push_back(parse_expression(true));
      expect_op(":");
      e->args.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    Token t = next();
    if (t.value == ".") {
      Token attr = next();
      if (attr.type == TokenType::Name) {
        auto e = make(ExprKind::Getattr, t.line);
        e->a = std::move(node);
        e->name = attr.value;
        return e;
      }
      if (attr.type != TokenType::Integer) fail(attr.line, "expected name or number");
      auto e = make(ExprKind::Getitem, t.line);
      e->a = std::move(node);
      e->b = constant(Value::integer(std::strtoll(attr.value.c_str(), nullptr, 10)), attr.line);
      return e;
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(ExprKind::Getitem, t.line);
    e->a = std::move(node);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = make(ExprKind::Tuple, t.line);
      e->b->args = std::move(args);
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    int line = cur().line;
    ExprPtr start;
    if (!skip_op(":")) {
      ExprPtr node = parse_expression(true);
      if (!is_op(":")) return node;
      next();
      start = std::move(node);
    }
    auto s = make(ExprKind::Slice, line);
    s->a = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) s->b = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) s->c = parse_expression(true);
    }
    return s;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        if (e.dyn_args || e.dyn_kwargs) fail(cur().line, "invalid syntax for function call expression");
        next();
        e.dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        if (e.dyn_kwargs) fail(cur().line, "invalid syntax for function call expression");
        next();
        e.dyn_kwargs = parse_expression(true);
      } else if (cur().type == TokenType::Name && look().type == TokenType::Op && look().value == "=") {
        if (e.dyn_kwargs) fail(cur().line, "invalid syntax for function call expression");
        std::string key = next().value;
        next();
        e.kwargs.push_back({key, parse_expression(true)});
      } else {
        if (e.dyn_args || e.dyn_kwargs || !e.kwargs.empty())
          fail(cur().line, "invalid syntax for function call expression");
        e.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(ExprKind::Call, cur().line);
    e->a = std::move(node);
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      int line = cur().line;
      auto e = make(ExprKind::Filter, line);
      e->name = dotted_name();
      if (!is_jinja_filter(e->name)) fail(line, fmt::format("unsupported filter '{}'", e->name));
      if (is_op("(")) parse_call_args(*e);
      e->a = std::move(node);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    int line = next().line;
    bool negated = skip_name("not");
    auto e = make(ExprKind::Test, line);
    e->name = dotted_name();
    if (!is_jinja_test(e->name)) fail(line, fmt::format("unsupported test '{}'", e->name));
    e->a = std::move(node);
    TokenType ct = cur().type;
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((ct == TokenType::Name || ct == TokenType::String || ct == TokenType::Integer ||
                ct == TokenType::Float || is_op("[") || is_op("{")) &&
               !is_name_in({"else", "or", "and"})) {
      if (is_name("is")) fail(cur().line, "You cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = make(ExprKind::Unary, line);
    n->name = "not";
    n->a = std::move(e);
    return n;
  }

  // Nesting guard: jinja2 itself cannot go deeper (Python's recursion limit), and a bound keeps a
  // hostile template from overflowing the stack.
  struct Nest {
    Nest(Parser& p, int line) : p_(p) {
      if (++p_.nesting_ > kMaxNesting) p_.fail(line, "the template nests too deeply");
    }
    ~Nest() { --p_.nesting_; }
    Parser& p_;
  };
  static constexpr int kMaxNesting = 200;

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
};

}  // namespace

bool is_jinja_filter(const std::string& name) { return kFilters.count(name) > 0; }
bool is_jinja_test(const std::string& name) { return kTests.count(name) > 0; }

Body parse_template(std::string_view source, const LexerOptions& options) {
  return Parser(tokenize(source, options)).parse();
}

}  // namespace kiln::tokenizer::jinja
