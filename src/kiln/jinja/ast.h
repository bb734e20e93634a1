// Syntax tree of a parsed Jinja template: expressions and statements as plain tagged nodes
// (one struct per level, fields used according to `kind`), owned through unique_ptr.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/jinja/value.h"

namespace kiln::jinja {

enum class ExprKind : uint8_t {
  Const,    // value
  Name,     // name
  Getattr,  // a.name
  Getitem,  // a[b]
  Slice,    // a:b:c inside [] (any may be null)
  Call,     // a(args, kwargs, *dyn_args, **dyn_kwargs)
  Filter,   // a|name(args, kwargs); a is null in filter blocks and `set x | f` blocks
  Test,     // a is name(args)
  Unary,    // name in {"-", "+", "not"}; operand a
  Binary,   // a name b; name in {+ - * / // % ** ~ and or}
  Compare,  // a ops[0] args[0] ops[1] args[1] ...; ops in {== != < <= > >= in notin}
  Cond,     // b if a else c (c may be null)
  List,     // [args...]
  Tuple,    // (args...)
  Dict,     // {args[0]: args[1], args[2]: args[3], ...}
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Keyword {
  std::string name;
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<Keyword> kwargs;
  ExprPtr dyn_args, dyn_kwargs;
  std::vector<std::string> ops;
};

// An assignment target: `x`, `a, b` (nested tuples allowed) or `ns.attr`.
struct Target {
  enum class Kind : uint8_t { Name, Tuple, NsAttr } kind = Kind::Name;
  std::string name, attr;
  std::vector<Target> items;
};

enum class StmtKind : uint8_t {
  Output,       // text
  Print,        // {{ expr }}
  If,           // branches (test, body)..., else_body
  For,          // target in expr [if cond] [recursive]: body, else_body
  Set,          // target = expr
  SetBlock,     // target [| expr filters] = rendered body
  Macro,        // text = name, params/defaults, body
  CallBlock,    // {% call(params) expr %} body
  FilterBlock,  // expr = filter chain with a null innermost operand; body
  With,         // assigns; body
  Scope,        // body in a new scope ({% generation %})
  Break,
  Continue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr, cond;
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned to the last params
  std::vector<std::pair<Target, ExprPtr>> assigns;
  bool recursive = false;
  // Macro/CallBlock: whether the body refers to these special names.
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};

}  // namespace kiln::jinja
