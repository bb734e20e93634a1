// Structured output through the engine (grammar_constraint.h) on the CPU with random-weight tiny
// models at temperature 1: for 120 schemas of the corpus (../shared/fixtures/json_schemas, those
// that compile), every output that ends with finish reason "stop" parses as JSON, its top-level
// required keys are there and its properties' declared simple types hold (an independent check;
// the e2e suite validates with ajv), and the grammar engine accepts it (secondary). A random model
// at temperature 1 picks nearly uniformly among the allowed tokens, so a string would close once
// in hundreds of tokens and never fit the 256-token context: the requests carry a logit_bias
// towards tokens holding '"' and the tokens ']' and '}' (applied after the mask, so it cannot make a
// disallowed token possible; it only makes outputs short). Also: GBNF (llama.cpp's arithmetic
// example) and regex constraints, a grammar that cannot complete within max_tokens ending with
// "length", and speculative decoding (prompt lookup) under a grammar, greedy and sampled.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/base/error.h"
#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/engine/speculative.h"
#include "kiln/grammar/grammar_cache.h"

using namespace kiln;
using namespace kiln::engine;
namespace fs = std::filesystem;

namespace {

std::string shared_dir() {
  const char* e = std::getenv("KILN_SHARED_DIR");
  return e ? e : KILN_SHARED_DIR;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Output {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::none;
  int n_events_after_end = 0;
  int draft_n = 0;
};

struct Fixture {
  std::unique_ptr<LoadedModel> m;
  std::shared_ptr<grammar::TokenTable> table;
  std::unique_ptr<grammar::GrammarCache> cache;
  std::map<int32_t, float> bias;  // towards short outputs (see the top)
  explicit Fixture(const std::string& name) : m(load_model(shared_dir() + "/models/" + name)) {
    table = grammar::TokenTable::from_tokenizer(*m->tokenizer);
    cache = std::make_unique<grammar::GrammarCache>(table);
    for (int32_t id = 0; id < table->vocab_size(); ++id) {
      const std::string& b = table->bytes(id);
      if (b.find('"') != std::string::npos) bias[id] = 8.0f;  // strings close, keys come
      else if (b == "]" || b == "}") bias[id] = 4.0f;        // arrays, objects and numbers end
    }
  }
  Request request(std::shared_ptr<const grammar::TokenMasker> g, uint64_t seed, float temperature = 1.0f) {
    Request r;
    r.prompt = m->tokenizer->encode("Once upon a time", true);
    r.max_tokens = m->config.max_position_embeddings - static_cast<int>(r.prompt.size());
    r.stop_ids = m->eos_ids();
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.logit_bias = bias;
    r.grammar = std::move(g);
    return r;
  }
  std::string text(const Output& o) const {
    std::vector<int32_t> ids = o.tokens;
    const std::vector<int32_t> eos = m->eos_ids();
    std::erase_if(ids, [&](int32_t t) { return std::find(eos.begin(), eos.end(), t) != eos.end(); });
    return m->tokenizer->decode(ids, false);
  }
};

std::vector<Output> run(model::Model& model, std::vector<Request> reqs, EngineConfig ec = {}) {
  ec.scheduler.max_seqs = 16;
  Engine eng(model, ec);
  std::vector<Output> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].on_event = [&out, i](const TokenEvent& e) {
      Output& o = out[i];
      if (o.reason != FinishReason::none) ++o.n_events_after_end;
      if (e.token >= 0) o.tokens.push_back(e.token);
      if (e.finished) o.reason = e.reason;
      o.draft_n = e.draft_n;
    };
    eng.add(std::move(reqs[i]));
  }
  while (eng.has_work()) eng.step();
  return out;
}

// The independent check: JSON that parses; for an object schema, its required keys present and
// each property with a simple "type" of the right JSON type.
bool type_ok(const Json& v, const std::string& t) {
  if (t == "string") return v.is_string();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "array") return v.is_array();
  if (t == "object") return v.is_object();
  return true;
}
std::string independent_check(const Json& schema, const std::string& text) {
  Json v;
  try {
    v = Json::parse(text);
  } catch (const std::exception& e) {
    return std::string("does not parse: ") + e.what();
  }
  if (schema.contains("type") && schema["type"].is_string() && !type_ok(v, schema["type"].get<std::string>()))
    return "top-level type is not " + schema["type"].get<std::string>();
  if (!v.is_object() || !schema.is_object()) return "";
  if (schema.contains("required") && schema["required"].is_array())
    for (const Json& k : schema["required"])
      if (k.is_string() && !v.contains(k.get<std::string>())) return "required key '" + k.get<std::string>() + "' missing";
  if (schema.contains("properties") && schema["properties"].is_object())
    for (auto& [k, ps] : schema["properties"].items())
      if (v.contains(k) && ps.is_object() && ps.contains("type") && ps["type"].is_string() &&
          !ps.contains("$ref") && !type_ok(v[k], ps["type"].get<std::string>()))
        return "property '" + k + "' is not " + ps["type"].get<std::string>();
  return "";
}

bool grammar_accepts(const grammar::TokenMasker& g, const std::string& text) {
  grammar::Matcher m(g.grammar());
  return m.accept_bytes(text) && m.is_complete();
}

}  // namespace

TEST(StructuredOutput, CorpusSchemasAtTemperatureOneGiveValidJson) {
  Fixture fx[2] = {Fixture("tiny-llama"), Fixture("tiny-qwen2")};
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(shared_dir()) / "fixtures" / "json_schemas"))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 400u);
  grammar::SchemaOptions opt;
  opt.additional_properties = false;  // as the server compiles response_format schemas
  struct Case {
    Json schema;
    std::shared_ptr<const grammar::TokenMasker> g;
    std::string name;
  };
  std::vector<Case> cases[2];
  int n = 0;
  // Every third schema, up to 120: a spread over the corpus's sources.
  for (size_t i = 0; i < files.size() && n < 120; i += 3) {
    const std::string text = Json::parse(read_file(files[i]))["schema"].dump();
    Fixture& f = fx[n % 2];
    try {
      cases[n % 2].push_back({Json::parse(text), f.cache->get(grammar::Source::json_schema, text, opt).masker,
                              files[i].filename().string()});
      ++n;
    } catch (const Error&) {
    }
  }
  ASSERT_GE(n, 100);
  int stopped = 0, valid = 0;
  for (int k = 0; k < 2; ++k) {
    std::vector<Request> reqs;
    for (size_t i = 0; i < cases[k].size(); ++i) reqs.push_back(fx[k].request(cases[k][i].g, 1000 + i));
    const std::vector<Output> out = run(*fx[k].m->model, std::move(reqs));
    for (size_t i = 0; i < out.size(); ++i) {
      const Case& c = cases[k][i];
      const std::string text = fx[k].text(out[i]);
      EXPECT_EQ(out[i].n_events_after_end, 0);
      EXPECT_NE(out[i].reason, FinishReason::none) << c.name;
      if (out[i].reason != FinishReason::stop) {  // ran out of context: a prefix of a valid output
        grammar::Matcher m(c.g->grammar());
        EXPECT_TRUE(m.accept_bytes(text)) << c.name << ": " << text;
        if (std::getenv("KILN_STRUCTURED_VERBOSE")) printf("LENGTH %s: %s\n", c.name.c_str(), text.c_str());
        continue;
      }
      ++stopped;
      const std::string why = independent_check(c.schema, text);
      EXPECT_EQ(why, "") << c.name << ": " << text << " tokens " << ::testing::PrintToString(out[i].tokens);
      EXPECT_TRUE(grammar_accepts(*c.g, text)) << c.name << ": " << text;
      valid += why.empty();
    }
  }
  printf("schemas %d, finished (stop) %d, valid %d\n", n, stopped, valid);
  EXPECT_GE(stopped, n * 17 / 20);  // most fit the 256-token context (not the largest schemas)
  EXPECT_EQ(valid, stopped);
}

TEST(StructuredOutput, GbnfAndRegexAreEnforced) {
  Fixture f("tiny-llama");
  const std::string arith = read_file(fs::path(KILN_SOURCE_DIR) / "tests/grammar/data/arithmetic.gbnf");
  auto g = f.cache->get(grammar::Source::gbnf, arith).masker;
  auto re = f.cache->get(grammar::Source::regex, "(yes|no)-[0-9]{3}").masker;
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(f.request(g, 7 + i));
  for (int i = 0; i < 8; ++i) reqs.push_back(f.request(re, 70 + i));
  const std::vector<Output> out = run(*f.m->model, std::move(reqs));
  for (int i = 0; i < 16; ++i) {
    const std::string text = f.text(out[i]);
    grammar::Matcher m((i < 8 ? g : re)->grammar());
    EXPECT_TRUE(m.accept_bytes(text)) << text;  // always a prefix of a sentence
    if (out[i].reason == FinishReason::stop) {
      EXPECT_TRUE(m.is_complete()) << text;
    }
    if (i >= 8) {
      EXPECT_EQ(out[i].reason, FinishReason::stop);
      EXPECT_EQ(text.size(), text[0] == 'y' ? 7u : 6u) << text;
    }
  }
}

TEST(StructuredOutput, AGrammarThatCannotCompleteInMaxTokensEndsWithLength) {
  Fixture f("tiny-llama");
  auto g = f.cache->get(grammar::Source::json_schema, R"({"type":"string","minLength":40})").masker;
  Request r = f.request(g, 3);
  r.max_tokens = 5;
  std::vector<Request> reqs;
  reqs.push_back(std::move(r));
  const std::vector<Output> out = run(*f.m->model, std::move(reqs));
  EXPECT_EQ(out[0].reason, FinishReason::length);
  EXPECT_EQ(out[0].tokens.size(), 5u);
  grammar::Matcher m(g->grammar());
  EXPECT_TRUE(m.accept_bytes(f.text(out[0])));
  EXPECT_FALSE(m.is_complete());
}

// Speculative decoding: each verify row is masked with the state after the drafts before it, and
// rejected drafts roll the grammar back. Greedy output equals plain greedy output token for token;
// sampled output stays valid.
TEST(StructuredOutput, SpeculativeDecodingKeepsTheGrammar) {
  Fixture f("stories260K");
  auto g = f.cache->get(grammar::Source::json_schema,
                        R"({"type":"object","properties":{"name":{"type":"string","maxLength":30},"tags":{"type":"array","items":{"enum":["a","bb","ccc"]}},"n":{"type":"integer"}},"required":["name","tags","n"]})",
                        {.additional_properties = false}).masker;
  auto draft = make_ngram_draft(1, 3);
  for (float temp : {0.0f, 1.0f}) {
    std::vector<Request> plain, spec;
    for (int i = 0; i < 6; ++i) {
      plain.push_back(f.request(g, 40 + i, temp));
      spec.push_back(f.request(g, 40 + i, temp));
    }
    EngineConfig ec;
    ec.spec = {draft.get(), 4, SpecAccept::residual, false};
    const std::vector<Output> a = run(*f.m->model, std::move(plain)), b = run(*f.m->model, std::move(spec), ec);
    int drafted = 0;
    for (int i = 0; i < 6; ++i) {
      drafted += b[i].draft_n;
      if (temp == 0.0f) {
        EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
      }
      for (const Output* o : {&a[i], &b[i]}) {
        const std::string text = f.text(*o);
        grammar::Matcher m(g->grammar());
        EXPECT_TRUE(m.accept_bytes(text)) << text;
        if (o->reason == FinishReason::stop) {
          EXPECT_TRUE(m.is_complete()) << text;
          EXPECT_EQ(independent_check(Json::parse(R"({"type":"object","required":["name","tags","n"]})"), text), "");
        }
      }
    }
    EXPECT_GT(drafted, 0);
  }
}

// Engine::rollback takes the grammar's state back with the tokens: the output after a rollback and
// more generation is still a sentence of the grammar.
TEST(StructuredOutput, RollbackTakesTheGrammarBack) {
  Fixture f("tiny-llama");
  auto g = f.cache->get(grammar::Source::regex, "\\[([a-z]{3},){6}[a-z]{3}\\]").masker;
  Engine eng(*f.m->model, {});
  Output o;
  Request r = f.request(g, 5);
  r.on_event = [&o](const TokenEvent& e) {
    if (e.token >= 0) o.tokens.push_back(e.token);
    if (e.finished) o.reason = e.reason;
  };
  const int64_t id = eng.add(std::move(r));
  while (o.tokens.size() < 8 && eng.has_work()) eng.step();
  ASSERT_EQ(o.reason, FinishReason::none);
  eng.rollback(id, 5);
  o.tokens.resize(o.tokens.size() - 5);
  while (eng.has_work()) eng.step();
  EXPECT_EQ(o.reason, FinishReason::stop);
  const std::string text = f.text(o);
  grammar::Matcher m(g->grammar());
  EXPECT_TRUE(m.accept_bytes(text) && m.is_complete()) << text;
}
