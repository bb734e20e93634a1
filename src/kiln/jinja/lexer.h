// Jinja lexer: template source -> tokens (template data, tag delimiters, expression tokens),
// with jinja2's whitespace rules: `{%-`/`-%}` stripping, trim_blocks, lstrip_blocks, raw blocks,
// comments, newline normalization and the dropped final newline (keep_trailing_newline=False).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja {

enum class TokenType : uint8_t {
  Data,        // template text, printed as is
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,   // value: the decoded literal
  Integer,  // value: digits without '_'
  Float,    // value: literal without '_'
  Op,       // value: the operator text ("+", "//", "==", "(", ...)
  Eof,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;
};

// What transformers uses: trim_blocks and lstrip_blocks on, keep_trailing_newline off.
struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Tokens ending with Eof. A syntax error throws kiln::Error("template", "line N: ...").
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options = {});

// Decodes the body of a string literal the way Python's unicode-escape codec does
// (\n \t \\ \' \" \xNN \uNNNN \UNNNNNNNN \ooo; unknown escapes keep the backslash).
std::string decode_string_literal(std::string_view body, int line);

}  // namespace kiln::jinja
