// Jinja lexer: token streams, jinja2's whitespace rules (trim_blocks, lstrip_blocks, `-`/`+`),
// string literal escapes, line numbers and lexing errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kiln/base/error.h"
#include "kiln/jinja/lexer.h"

namespace kiln::jinja {
namespace {

// Tokens as "T:value" strings (D data, N name, S string, I int, F float, O op, {{ }} {% %}).
std::vector<std::string> lex(const std::string& src, const LexerOptions& opt = {}) {
  std::vector<std::string> out;
  for (const auto& t : tokenize(src, opt)) {
    switch (t.type) {
      case TokenType::Data: out.push_back("D:" + t.value); break;
      case TokenType::VarBegin: out.push_back("{{"); break;
      case TokenType::VarEnd: out.push_back("}}"); break;
      case TokenType::BlockBegin: out.push_back("{%"); break;
      case TokenType::BlockEnd: out.push_back("%}"); break;
      case TokenType::Name: out.push_back("N:" + t.value); break;
      case TokenType::String: out.push_back("S:" + t.value); break;
      case TokenType::Integer: out.push_back("I:" + t.value); break;
      case TokenType::Float: out.push_back("F:" + t.value); break;
      case TokenType::Op: out.push_back("O:" + t.value); break;
      case TokenType::Eof: break;
    }
  }
  return out;
}

using V = std::vector<std::string>;

std::string error_of(const std::string& src) {
  try {
    tokenize(src);
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JinjaLexer, ExpressionTokens) {
  EXPECT_EQ(lex("{{ a.b[0] | f(1, x=2.5) ~ 'q' }}"),
            (V{"{{", "N:a", "O:.", "N:b", "O:[", "I:0", "O:]", "O:|", "N:f", "O:(", "I:1", "O:,", "N:x", "O:=", "F:2.5",
               "O:)", "O:~", "S:q", "}}"}));
  EXPECT_EQ(lex("{{ 1_000 1e3 1.5E-2 x.0.1 a//b**c != d }}"),
            (V{"{{", "I:1000", "F:1e3", "F:1.5e-2", "N:x", "O:.", "I:0", "O:.", "I:1", "N:a", "O://", "N:b", "O:**",
               "N:c", "O:!=", "N:d", "}}"}));
  // Inside brackets `}}` does not end the tag.
  EXPECT_EQ(lex("{{ {'a': {'b': 1}} }}"),
            (V{"{{", "O:{", "S:a", "O::", "O:{", "S:b", "O::", "I:1", "O:}", "O:}", "}}"}));
}

TEST(JinjaLexer, StringLiteralEscapes) {
  EXPECT_EQ(decode_string_literal(R"(a\nb\t\\\'\"\x41\u00e9\U0001F600\101\q)", 1), "a\nb\t\\'\"Aé😀A\\q");
  EXPECT_EQ(lex(R"({{ "it's" 'say "x"' }})"), (V{"{{", "S:it's", "S:say \"x\"", "}}"}));
  EXPECT_THROW(decode_string_literal(R"(\x4)", 1), kiln::Error);
}

TEST(JinjaLexer, TrimBlocksAndLstripBlocks) {
  EXPECT_EQ(lex("a\n  {% x %}\n  b"), (V{"D:a\n", "{%", "N:x", "%}", "D:  b"}));
  LexerOptions plain{false, false, true};
  EXPECT_EQ(lex("a\n  {% x %}\n  b", plain), (V{"D:a\n  ", "{%", "N:x", "%}", "D:\n  b"}));
  // `+` keeps the indentation, `-` strips all whitespace on that side.
  EXPECT_EQ(lex("a\n  {%+ x +%}\nb"), (V{"D:a\n  ", "{%", "N:x", "%}", "D:\nb"}));
  EXPECT_EQ(lex("a \n {%- x -%} \n b"), (V{"D:a", "{%", "N:x", "%}", "D:b"}));
  // lstrip does not apply to {{ }} nor after text on the same line.
  EXPECT_EQ(lex("  {{ x }}\nq {% y %}"), (V{"D:  ", "{{", "N:x", "}}", "D:\nq ", "{%", "N:y", "%}"}));
  EXPECT_EQ(lex("{{ x }}  {% y %}"), (V{"{{", "N:x", "}}", "D:  ", "{%", "N:y", "%}"}));
}

TEST(JinjaLexer, CommentsRawAndNewlines) {
  EXPECT_EQ(lex("a{# c #}\nb  {#- c -#}  c"), (V{"D:a", "D:b", "D:c"}));
  EXPECT_EQ(lex("{% raw %}{{ x }}{% endraw %}"), (V{"D:{{ x }}"}));
  EXPECT_EQ(lex("a\r\nb\rc\n"), (V{"D:a\nb\nc"}));  // normalized; one final newline dropped
  EXPECT_EQ(lex("a\n\n"), (V{"D:a\n"}));
  LexerOptions keep;
  keep.keep_trailing_newline = true;
  EXPECT_EQ(lex("a\n", keep), (V{"D:a\n"}));
}

TEST(JinjaLexer, LineNumbers) {
  auto toks = tokenize("a\nb {{ x\n + y }}\n{% z %}");
  ASSERT_GE(toks.size(), 9u);
  EXPECT_EQ(toks[0].line, 1);  // data "a\nb "
  EXPECT_EQ(toks[2].line, 2);  // x
  EXPECT_EQ(toks[3].line, 3);  // +
  EXPECT_EQ(toks[6].line, 3);  // data "\n"
  EXPECT_EQ(toks[7].line, 4);  // {%
}

TEST(JinjaLexer, Errors) {
  EXPECT_EQ(error_of("{{ a ! b }}"), "[template] line 1: unexpected char '!' at 5");
  EXPECT_EQ(error_of("{{ (a] }}"), "[template] line 1: unexpected ']', expected ')'");
  EXPECT_EQ(error_of("\n{{ a) }}"), "[template] line 2: unexpected ')'");
  EXPECT_EQ(error_of("x {# never closed"), "[template] line 1: Missing end of comment tag");
  EXPECT_EQ(error_of("{% raw %} no end"), "[template] line 1: Missing end of raw directive");
  EXPECT_EQ(error_of("{{ 'open }}"), "[template] line 1: unexpected char \"'\" at 3");
}

}  // namespace
}  // namespace kiln::jinja
