// The Jinja parser's class, shared by its two halves: parser.cpp (statements) and
// parser_expr.cpp (expressions). Private to the interpreter; use parser.h.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "kiln/base/error.h"
#include "kiln/jinja/ast.h"
#include "kiln/jinja/lexer.h"

namespace kiln::jinja {

// Token description for messages ("end of print statement", a name, an operator).
const char* describe(const Token& t);
ExprPtr make(ExprKind kind, int line);

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

  // ---- statements (parser.cpp) ----
  Body subparse(Names end_tokens);
  Body parse_statements(Names end_tokens, bool drop_needle, const char* opener, int line);
  StmtPtr parse_statement();
  StmtPtr parse_for();
  StmtPtr parse_if();
  StmtPtr parse_set();
  void parse_signature(Stmt& s);
  void parse_callable_body(Stmt& s, const char* end_tag, const char* opener);
  StmtPtr parse_macro();
  StmtPtr parse_call_block();
  StmtPtr parse_filter_block();
  StmtPtr parse_with();
  Target to_target(const Expr& e);
  Target parse_assign_target(bool with_tuple, bool name_only, Names extra_end, bool with_namespace);

  // ---- expressions (parser_expr.cpp) ----
  bool is_tuple_end(Names extra_end) const;
  ExprPtr parse_tuple(bool simplified, bool with_condexpr, Names extra_end, bool explicit_parens);
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr parse_condexpr();
  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line);
  ExprPtr parse_binary(size_t level);  // 0: or, 1: and, 2: + -, 3: ~, 4: * / // %, 5: **
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr constant(Value v, int line);
  ExprPtr parse_primary();
  ExprPtr parse_list_or_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  void parse_call_args(Expr& e);
  ExprPtr parse_call(ExprPtr node);
  std::string dotted_name();
  ExprPtr parse_filter(ExprPtr node, bool start_inline);
  ExprPtr parse_test(ExprPtr node);

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

}  // namespace kiln::jinja
