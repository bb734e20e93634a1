// Jinja parser, expressions half: jinja2's precedence climbing (condexpr < or < and < not <
// compare < +,- < ~ < *,/,//,% < ** < unary < postfix/filters/tests) with its quirks: `is` binds
// tighter than arithmetic, `-x|f` filters the negation, a test argument may follow without
// parentheses, adjacent string literals concatenate.
#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "kiln/jinja/parser.h"
#include "kiln/jinja/parser_impl.h"

namespace kiln::jinja {

bool Parser::is_tuple_end(Names extra_end) const {
  if (cur().type == TokenType::VarEnd || cur().type == TokenType::BlockEnd || is_op(")")) return true;
  return extra_end.size() && is_name_in(extra_end);
}

ExprPtr Parser::parse_tuple(bool simplified, bool with_condexpr, Names extra_end, bool explicit_parens) {
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

ExprPtr Parser::parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_binary(0); }

ExprPtr Parser::parse_condexpr() {
  ExprPtr expr1 = parse_binary(0);
  while (is_name("if")) {
    int line = next().line;
    auto c = make(ExprKind::Cond, line);
    c->a = parse_binary(0);
    if (skip_name("else")) c->c = parse_condexpr();
    c->b = std::move(expr1);
    expr1 = std::move(c);
  }
  return expr1;
}

ExprPtr Parser::binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
  auto e = make(ExprKind::Binary, line);
  e->name = op;
  e->a = std::move(l);
  e->b = std::move(r);
  return e;
}

// jinja2's left-associative binary levels, loosest first: `or`, `and` (then `not` and the
// comparisons, which parse_not reads), `+ -`, `~`, `* / // %`, `**` (then the unary operators).
// The keywords are Name tokens and the rest Op tokens; neither kind can spell the other.
ExprPtr Parser::parse_binary(size_t level) {
  static const std::vector<std::vector<std::string>> kLevels = {
      {"or"}, {"and"}, {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
  auto operand = [&] {
    if (level == 1) return parse_not();
    return level + 1 < kLevels.size() ? parse_binary(level + 1) : parse_unary(true);
  };
  const std::vector<std::string>& ops = kLevels[level];
  ExprPtr left = operand();
  while ((cur().type == TokenType::Name || cur().type == TokenType::Op) &&
         std::find(ops.begin(), ops.end(), cur().value) != ops.end()) {
    Token t = next();
    left = binary(t.value, std::move(left), operand(), t.line);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  Nest nest(*this, cur().line);
  if (is_name("not")) {
    auto e = make(ExprKind::Unary, next().line);
    e->name = "not";
    e->a = parse_not();
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  int line = cur().line;
  ExprPtr expr = parse_binary(2);
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
    operands.push_back(parse_binary(2));
  }
  if (ops.empty()) return expr;
  auto e = make(ExprKind::Compare, line);
  e->a = std::move(expr);
  e->ops = std::move(ops);
  e->args = std::move(operands);
  return e;
}

ExprPtr Parser::parse_unary(bool with_filter) {
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

ExprPtr Parser::constant(Value v, int line) {
  auto e = make(ExprKind::Const, line);
  e->value = std::move(v);
  return e;
}

ExprPtr Parser::parse_primary() {
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
      if (t.value == "[" || t.value == "{") return parse_list_or_dict();
      break;
    default: break;
  }
  if (t.type == TokenType::Eof) fail(line, "unexpected end of template");
  fail(line, fmt::format("unexpected '{}'", describe(t)));
}

// `[a, b]` or `{k: v, ...}`, a trailing comma allowed.
ExprPtr Parser::parse_list_or_dict() {
  const bool dict = is_op("{");
  const char* close = dict ? "}" : "]";
  auto e = make(dict ? ExprKind::Dict : ExprKind::List, next().line);
  while (!is_op(close)) {
    if (!e->args.empty()) expect_op(",");
    if (is_op(close)) break;
    e->args.push_back(parse_expression(true));
    if (dict) {
      expect_op(":");
      e->args.push_back(parse_expression(true));
    }
  }
  expect_op(close);
  return e;
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
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

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
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

ExprPtr Parser::parse_subscript(ExprPtr node) {
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

ExprPtr Parser::parse_subscribed() {
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

void Parser::parse_call_args(Expr& e) {
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

ExprPtr Parser::parse_call(ExprPtr node) {
  auto e = make(ExprKind::Call, cur().line);
  e->a = std::move(node);
  parse_call_args(*e);
  return e;
}

std::string Parser::dotted_name() {
  std::string name = expect_name();
  while (is_op(".")) {
    next();
    name += "." + expect_name();
  }
  return name;
}

ExprPtr Parser::parse_filter(ExprPtr node, bool start_inline) {
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

ExprPtr Parser::parse_test(ExprPtr node) {
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

}  // namespace kiln::jinja
