// Jinja parser, statements half (see parser.h): a recursive-descent port of jinja2's parser
// for tags (for/if/set/macro/call/filter/with/print/break/continue/generation) and assignment
// targets. Expressions are in parser_expr.cpp.
#include "kiln/jinja/parser.h"

#include <cerrno>
#include <cstdlib>
#include <set>

#include "kiln/base/error.h"
#include "kiln/jinja/parser_impl.h"

namespace kiln::jinja {
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

StmtPtr make_stmt(StmtKind kind, int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->line = line;
  return s;
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

}  // namespace

ExprPtr make(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
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


Body Parser::subparse(Names end_tokens) {
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

Body Parser::parse_statements(Names end_tokens, bool drop_needle, const char* opener, int line) {
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

StmtPtr Parser::parse_statement() {
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

StmtPtr Parser::parse_for() {
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

StmtPtr Parser::parse_if() {
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

StmtPtr Parser::parse_set() {
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

void Parser::parse_signature(Stmt& s) {
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

// The body of a macro or call block: an enclosing loop does not count inside it (no `break`), and
// its loads of caller, varargs and kwargs are noted.
void Parser::parse_callable_body(Stmt& s, const char* end_tag, const char* opener) {
  int saved = loop_depth_;
  loop_depth_ = 0;
  s.body = parse_statements({end_tag}, true, opener, s.line);
  loop_depth_ = saved;
  SpecialNames names;
  names.body(s.body);
  s.uses_caller = names.caller;
  s.uses_varargs = names.varargs;
  s.uses_kwargs = names.kwargs;
}

StmtPtr Parser::parse_macro() {
  auto s = make_stmt(StmtKind::Macro, next().line);
  s->text = expect_name();
  parse_signature(*s);
  parse_callable_body(*s, "endmacro", "macro");
  return s;
}

StmtPtr Parser::parse_call_block() {
  auto s = make_stmt(StmtKind::CallBlock, next().line);
  if (is_op("(")) parse_signature(*s);
  s->expr = parse_expression(true);
  if (s->expr->kind != ExprKind::Call) fail(s->line, "expected call");
  parse_callable_body(*s, "endcall", "call");
  return s;
}

StmtPtr Parser::parse_filter_block() {
  auto s = make_stmt(StmtKind::FilterBlock, next().line);
  s->expr = parse_filter(nullptr, true);
  s->body = parse_statements({"endfilter"}, true, "filter", s->line);
  return s;
}

StmtPtr Parser::parse_with() {
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

Target Parser::to_target(const Expr& e) {
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

Target Parser::parse_assign_target(bool with_tuple, bool name_only, Names extra_end, bool with_namespace) {
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

bool is_jinja_filter(const std::string& name) { return kFilters.count(name) > 0; }
bool is_jinja_test(const std::string& name) { return kTests.count(name) > 0; }

Body parse_template(std::string_view source, const LexerOptions& options) {
  return Parser(tokenize(source, options)).parse();
}

}  // namespace kiln::jinja
