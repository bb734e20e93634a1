// The grammar engine without a vocabulary: regexes, GBNF (llama.cpp's example grammars in
// tests/grammar/data, see PROVENANCE.md), JSON Schema features, integer ranges against arithmetic,
// rollback, and UTF-8 characters split between tokens.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "kiln/base/error.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/matcher.h"

namespace kiln::grammar {
namespace {

std::string read_data(const std::string& name) {
  std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/grammar/data/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_FALSE(ss.str().empty()) << name;
  return ss.str();
}

std::shared_ptr<const CompiledGrammar> compile(const Grammar& g) { return std::make_shared<CompiledGrammar>(g); }

// Fed byte by byte (each byte a token); accepted and complete.
bool accepts(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  Matcher m(g);
  for (char c : s)
    if (!m.accept_bytes(std::string_view(&c, 1))) return false;
  return m.is_complete();
}

TEST(GrammarRegex, FullMatch) {
  auto g = compile(regex_grammar("[a-c]+x?"));
  EXPECT_TRUE(accepts(g, "abcab"));
  EXPECT_TRUE(accepts(g, "ax"));
  EXPECT_FALSE(accepts(g, "x"));
  EXPECT_FALSE(accepts(g, "abxx"));
  g = compile(regex_grammar("(ab|cd){2,3}"));
  EXPECT_TRUE(accepts(g, "abcd"));
  EXPECT_TRUE(accepts(g, "cdcdab"));
  EXPECT_FALSE(accepts(g, "ab"));
  EXPECT_FALSE(accepts(g, "abababab"));
  g = compile(regex_grammar("\\d{3}-\\d{4}"));
  EXPECT_TRUE(accepts(g, "555-1234"));
  EXPECT_FALSE(accepts(g, "555-123"));
  g = compile(regex_grammar("[α-ω]+ .\\."));
  EXPECT_TRUE(accepts(g, "λω é."));
  EXPECT_FALSE(accepts(g, "a é."));
  g = compile(regex_grammar("^(?:yes|no)$"));
  EXPECT_TRUE(accepts(g, "yes"));
  EXPECT_FALSE(accepts(g, "yesno"));
}

TEST(GrammarRegex, UnsupportedIsAnErrorNamingIt) {
  auto msg = [](const char* re) {
    try {
      regex_grammar(re);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("a(?=b)").find("lookaround"), std::string::npos);
  EXPECT_NE(msg("(a)\\1").find("backreference"), std::string::npos);
  EXPECT_NE(msg("a\\bc").find("word boundary"), std::string::npos);
  EXPECT_NE(msg("(ab").find("')'"), std::string::npos);
}

TEST(GrammarGbnf, Arithmetic) {
  auto g = compile(parse_gbnf(read_data("arithmetic.gbnf")));
  EXPECT_TRUE(accepts(g, "1+2=3\n"));
  EXPECT_TRUE(accepts(g, "x=1\n(a +b)*c= 12\n"));
  EXPECT_TRUE(accepts(g, "( x_1 /2 )-y=z\n"));
  EXPECT_FALSE(accepts(g, "1+2=3"));  // not complete without the newline
  EXPECT_FALSE(accepts(g, "1+=3\n"));
  EXPECT_FALSE(accepts(g, "A=1\n"));
  EXPECT_FALSE(accepts(g, "(1=2\n"));
}

TEST(GrammarGbnf, List) {
  auto g = compile(parse_gbnf(read_data("list.gbnf")));
  EXPECT_TRUE(accepts(g, "- apple\n- banana split\n"));
  EXPECT_TRUE(accepts(g, "- ünïcödé ✓\n"));
  EXPECT_FALSE(accepts(g, "- \n"));
  EXPECT_FALSE(accepts(g, "* apple\n"));
  EXPECT_FALSE(accepts(g, "- a\rb\n"));
  EXPECT_FALSE(accepts(g, "- a\xe2\x80\xa8" "b\n"));  // U+2028
  EXPECT_FALSE(accepts(g, ""));
}

TEST(GrammarGbnf, Json) {
  auto g = compile(parse_gbnf(read_data("json.gbnf")));
  EXPECT_TRUE(accepts(g, R"({"a": [1, 2.5, "x\n", true], "b": {"c": null}})"));
  EXPECT_TRUE(accepts(g, "{\n  \"k\": -0.5e+3\n}"));
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_FALSE(accepts(g, R"({"a":})"));
  EXPECT_FALSE(accepts(g, "[1]"));
  EXPECT_FALSE(accepts(g, R"({"a": 01})"));
  EXPECT_FALSE(accepts(g, R"({"a": "\x"})"));
  EXPECT_FALSE(accepts(g, R"({"a": 1,})"));
}

TEST(GrammarGbnf, Errors) {
  auto msg = [](const std::string& text) {
    try {
      parse_gbnf(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("root ::= foo\n").find("foo is used but never defined"), std::string::npos);
  EXPECT_NE(msg("start ::= \"a\"\n").find("no root rule"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\n").find("unterminated literal"), std::string::npos);
  EXPECT_NE(msg("root ::= (\"a\"\n").find("expected )"), std::string::npos);
  EXPECT_NE(msg("root = \"a\"\n").find("::="), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"{3,1}\n").find("n < m"), std::string::npos);
  // A grammar that can never finish is refused when compiled.
  EXPECT_THROW(CompiledGrammar(parse_gbnf("root ::= \"a\" root\n")), Error);
}

TEST(GrammarGbnf, RepetitionOfRules) {
  auto g = compile(parse_gbnf("root ::= item{2,3} tail*\nitem ::= \"a\" | \"b\" item\ntail ::= \"!\" | item\n"));
  EXPECT_TRUE(accepts(g, "aa"));
  EXPECT_TRUE(accepts(g, "abaa!!a"));
  EXPECT_FALSE(accepts(g, "a"));
  EXPECT_TRUE(accepts(g, "aaaa"));  // 3 items + a tail item
  // Left recursion is fine for Earley.
  g = compile(parse_gbnf("root ::= root \"+\" n | n\nn ::= [0-9]+\n"));
  EXPECT_TRUE(accepts(g, "1+22+333"));
  EXPECT_FALSE(accepts(g, "1++2"));
}

TEST(GrammarMatcher, RollbackRestoresTheState) {
  auto g = compile(parse_gbnf(read_data("json.gbnf")));
  const std::string text = R"({"name": "kiln", "list": [1, 2, {"x": "é✓"}], "ok": true})";
  // Tokens: random chunks of 1..5 bytes.
  std::mt19937 rng(7);
  std::vector<std::string> toks;
  for (size_t i = 0; i < text.size();) {
    size_t n = std::min<size_t>(1 + rng() % 5, text.size() - i);
    toks.push_back(text.substr(i, n));
    i += n;
  }
  for (int trial = 0; trial < 50; ++trial) {
    size_t k = rng() % (toks.size() + 1), j = k ? rng() % (k + 1) : 0;
    Matcher a(g), b(g);
    for (size_t i = 0; i < k; ++i) ASSERT_TRUE(a.accept_bytes(toks[i]));
    a.rollback(j);
    for (size_t i = 0; i < k - j; ++i) ASSERT_TRUE(b.accept_bytes(toks[i]));
    EXPECT_TRUE(a == b) << "k=" << k << " j=" << j;
    EXPECT_EQ(a.n_tokens(), k - j);
    // And it continues the same way.
    for (size_t i = k - j; i < toks.size(); ++i) ASSERT_TRUE(a.accept_bytes(toks[i]));
    EXPECT_TRUE(a.is_complete());
  }
  // A rejected token leaves the state as it was.
  Matcher m(g);
  ASSERT_TRUE(m.accept_bytes("{\"a\""));
  Matcher before = m;
  EXPECT_FALSE(m.accept_bytes(":1}x"));
  EXPECT_TRUE(m == before);
}

TEST(GrammarMatcher, Utf8SplitAcrossTokens) {
  auto g = compile(json_schema_grammar(OrderedJson::parse(R"({"type":"string","maxLength":2})")).grammar);
  Matcher m(g);
  ASSERT_TRUE(m.accept_bytes("\"\xC3"));  // a token ending inside é (C3 A9)
  EXPECT_FALSE(m.accept_bytes("A"));      // not a continuation byte
  ASSERT_TRUE(m.accept_bytes("\xA9\xE2\x9C"));  // é completes, ✓ (E2 9C 93) starts
  EXPECT_FALSE(m.accept_bytes("\x93" "a"));     // a third character is past maxLength
  ASSERT_TRUE(m.accept_bytes("\x93\""));
  EXPECT_TRUE(m.is_complete());
  // Overlong and surrogate encodings are no characters.
  auto g2 = compile(regex_grammar(".+"));
  EXPECT_FALSE(accepts(g2, "\xC0\xAF"));
  EXPECT_FALSE(accepts(g2, "\xED\xA0\x80"));
  EXPECT_TRUE(accepts(g2, "\xF0\x9F\x98\x80"));
}

// ---- JSON Schema ----

std::shared_ptr<const CompiledGrammar> schema(const std::string& text, std::vector<std::string>* warnings = nullptr,
                                               SchemaOptions opt = {}) {
  SchemaGrammar sg = json_schema_grammar(text, opt);
  if (warnings) *warnings = sg.warnings;
  return compile(sg.grammar);
}

TEST(GrammarSchema, ObjectsRequiredOptionalAdditional) {
  auto g = schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},
                      "required":["b"],"additionalProperties":false})");
  EXPECT_TRUE(accepts(g, R"({"b":"x"})"));
  EXPECT_TRUE(accepts(g, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(accepts(g, R"({"b":"","c":false})"));
  EXPECT_FALSE(accepts(g, R"({"a":1})"));
  EXPECT_FALSE(accepts(g, R"({"b":"x","d":1})"));
  EXPECT_FALSE(accepts(g, R"({"b":1})"));
  EXPECT_FALSE(accepts(g, R"({"b": "x"})"));  // compact: no whitespace
  auto open = schema(R"({"type":"object","properties":{"a":{"type":"null"}}})");
  EXPECT_TRUE(accepts(open, R"({"a":null,"zz":[1,{"q":"r"}]})"));
  EXPECT_TRUE(accepts(open, R"({"zz":1,"yy":2})"));
  EXPECT_TRUE(accepts(open, "{}"));
  auto typed = schema(R"({"type":"object","additionalProperties":{"type":"number"}})");
  EXPECT_TRUE(accepts(typed, R"({"x":1.5,"y":-2e3})"));
  EXPECT_FALSE(accepts(typed, R"({"x":"1"})"));
  auto obj = compile(json_object_grammar());
  EXPECT_TRUE(accepts(obj, R"({"a":[true,false,null,"\u00e9"]})"));
  EXPECT_FALSE(accepts(obj, "[1]"));
  EXPECT_FALSE(accepts(obj, "\"s\""));
}

TEST(GrammarSchema, EnumConstUnionsRefs) {
  auto g = schema(R"({"type":"array","items":{"anyOf":[{"enum":["red","green",3,null]},{"const":{"k":[1]}},{"type":["boolean","null"]}]}})");
  EXPECT_TRUE(accepts(g, R"(["red",3,null,{"k":[1]},true])"));
  EXPECT_TRUE(accepts(g, "[]"));
  EXPECT_FALSE(accepts(g, R"(["blue"])"));
  EXPECT_FALSE(accepts(g, R"([{"k":[2]}])"));
  // A recursive tree through $defs.
  auto tree = schema(R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{
                         "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],
                         "additionalProperties":false}}})");
  EXPECT_TRUE(accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(accepts(tree, R"({"v":1,"kids":[{"kids":[]}]})"));
  // allOf of objects merges properties and required.
  auto all = schema(R"({"allOf":[{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},
                                {"properties":{"b":{"type":"integer"}},"required":["b"]}],"additionalProperties":false})");
  EXPECT_TRUE(accepts(all, R"({"a":"x","b":2})"));
  EXPECT_FALSE(accepts(all, R"({"a":"x"})"));
  // "#" refers to the root.
  auto list = schema(R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["next"],
                         "additionalProperties":false})");
  EXPECT_TRUE(accepts(list, R"({"next":{"next":{"next":null}}})"));
}

TEST(GrammarSchema, ArraysAndStrings) {
  auto g = schema(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":{"type":"boolean"},
                      "minItems":1,"maxItems":4})");
  EXPECT_TRUE(accepts(g, R"(["a"])"));
  EXPECT_TRUE(accepts(g, R"(["a",1,true,false])"));
  EXPECT_FALSE(accepts(g, "[]"));
  EXPECT_FALSE(accepts(g, R"(["a",1,true,false,true])"));
  EXPECT_FALSE(accepts(g, R"([1])"));
  auto s = schema(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(accepts(s, R"("a")"));
  EXPECT_TRUE(accepts(s, R"("ab")"));
  EXPECT_TRUE(accepts(s, R"("a\nb")"));  // an escape is one character
  EXPECT_FALSE(accepts(s, R"("abcd")"));
  auto p = schema(R"({"type":"string","pattern":"^[A-Z]{2}-[0-9]+$"})");
  EXPECT_TRUE(accepts(p, R"("AB-12")"));
  EXPECT_FALSE(accepts(p, R"("AB-")"));
  auto search = schema(R"({"type":"string","pattern":"ab+c"})");  // unanchored: anywhere in the string
  EXPECT_TRUE(accepts(search, R"("xxabbbcyy")"));
  EXPECT_FALSE(accepts(search, R"("xxacyy")"));
  auto quote = schema(R"({"type":"string","pattern":"^a\"b$"})");  // the pattern's quote is escaped in JSON
  EXPECT_TRUE(accepts(quote, R"("a\"b")"));
  struct F {
    const char *format, *good, *bad;
  };
  for (const F& f : {F{"date", "\"2024-02-29\"", "\"2024-13-01\""}, F{"time", "\"23:59:60.5Z\"", "\"24:00:00Z\""},
                     F{"date-time", "\"2024-01-01T10:20:30+02:00\"", "\"2024-01-01 10:20\""},
                     F{"uuid", "\"123e4567-e89b-12d3-a456-426614174000\"", "\"123e4567e89b12d3a456426614174000\""},
                     F{"email", "\"a.b+c@example.co\"", "\"a@b\""}}) {
    auto fg = schema(std::string(R"({"type":"string","format":")") + f.format + "\"}");
    EXPECT_TRUE(accepts(fg, f.good)) << f.format;
    EXPECT_FALSE(accepts(fg, f.bad)) << f.format;
  }
}

TEST(GrammarSchema, IntegerRangesMatchArithmetic) {
  struct B {
    const char* json;
    long lo, hi;  // inclusive; LONG_MIN/LONG_MAX: unbounded
  };
  const long inf = 1L << 40;
  for (const B& b : {B{R"("minimum":0)", 0, inf}, B{R"("minimum":-7,"maximum":123)", -7, 123}, B{R"("maximum":-20)", -inf, -20},
                     B{R"("minimum":95,"maximum":1050)", 95, 1050}, B{R"("exclusiveMinimum":9,"exclusiveMaximum":100)", 10, 99},
                     B{R"("minimum":-1000,"maximum":-999)", -1000, -999}, B{R"("minimum":1.5,"maximum":3.5)", 2, 3},
                     B{R"("minimum":10,"exclusiveMinimum":true)", 11, inf}, B{R"("minimum":37)", 37, inf}}) {
    auto g = schema(std::string(R"({"type":"integer",)") + b.json + "}");
    for (long v = -1200; v <= 1200; ++v)
      ASSERT_EQ(accepts(g, std::to_string(v)), v >= b.lo && v <= b.hi) << b.json << " v=" << v;
    EXPECT_EQ(accepts(g, "123456789"), b.hi == inf);
    EXPECT_FALSE(accepts(g, "007"));
  }
}

TEST(GrammarSchema, UnenforceableKeywordsWarnOrFailUnderStrict) {
  std::vector<std::string> w;
  auto g = schema(R"({"type":"object","properties":{"x":{"type":"string","format":"uri"},"y":{"not":{"type":"null"}}}})", &w);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("format 'uri' at #/properties/x"), std::string::npos) << w[0];
  EXPECT_NE(w[1].find("keyword 'not' at #/properties/y"), std::string::npos) << w[1];
  EXPECT_TRUE(accepts(g, R"({"x":"anything"})"));  // looser than the schema, and said so
  SchemaOptions strict;
  strict.strict = true;
  try {
    json_schema_grammar(std::string(R"({"type":"array","uniqueItems":true})"), strict);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'uniqueItems' at #"), std::string::npos) << e.what();
  }
  // Annotations and unknown keywords are no constraints: no warning.
  schema(R"({"type":"string","title":"t","description":"d","examples":["x"],"x-foo":1,"javaType":"X"})", &w);
  EXPECT_TRUE(w.empty());
  EXPECT_THROW(json_schema_grammar(std::string(R"({"$ref":"#/nope"})")), Error);
  EXPECT_THROW(json_schema_grammar(std::string(R"({"type":"strin"})")), Error);
  EXPECT_THROW(CompiledGrammar(json_schema_grammar(std::string("false")).grammar), Error);
}

}  // namespace
}  // namespace kiln::grammar
