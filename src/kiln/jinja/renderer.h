// A compiled Jinja template and its renderer: statements (if/for/set/macro/call/filter/with,
// break/continue), jinja2's scoping (loop bodies, macros and blocks get their own scope; `if`
// does not), macros with defaults/varargs/kwargs/caller, the loop object and namespaces.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "kiln/jinja/ast.h"
#include "kiln/jinja/lexer.h"

namespace kiln::jinja {

class Template {
 public:
  // Parses source (transformers' environment: trim_blocks, lstrip_blocks). Syntax errors and
  // unknown constructs throw kiln::Error("template", "line N: ...").
  explicit Template(std::string_view source, const LexerOptions& options = {});

  // Renders with `context` as the template's variables; the globals (range, namespace, dict,
  // raise_exception, strftime_now, ...) sit underneath. Failures throw kiln::Error with
  // component "template": "line N: <what>", or "raise_exception: <message>".
  std::string render(const DictData& context) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace kiln::jinja
