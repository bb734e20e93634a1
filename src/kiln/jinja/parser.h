// Jinja parser: tokens -> syntax tree, with jinja2's grammar and operator precedence
// (condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary < postfix/filters/tests).
#pragma once
#include <string_view>
#include <vector>

#include "kiln/jinja/ast.h"
#include "kiln/jinja/lexer.h"

namespace kiln::jinja {

// Parses a whole template. Syntax errors and tags/filters/tests the interpreter does not
// know throw kiln::Error("template", "line N: ...").
Body parse_template(std::string_view source, const LexerOptions& options = {});

// The filter and test names jinja2 defines (a name outside these fails at parse time, as in
// jinja2; a known name the interpreter lacks fails when it runs).
bool is_jinja_filter(const std::string& name);
bool is_jinja_test(const std::string& name);

}  // namespace kiln::jinja
