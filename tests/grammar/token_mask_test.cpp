// Token masks with real vocabularies (../shared/fixtures/tokenizers: llama3 128k, gpt2 50k, llama2
// 32k SentencePiece). The oracle of the trie + precomputed path (fill_mask) is brute force
// (fill_mask_brute: every token fed to a copy of the state), compared on random reachable states of
// several schemas and the GBNF grammars. Random walks that sample allowed tokens until the grammar
// completes produce JSON that nlohmann parses and that has the handwritten schemas' types and
// required fields (an independent check; the engine's own acceptance would be circular).
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>

#include "kiln/base/error.h"
#include "kiln/grammar/grammar_cache.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/token_mask.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::grammar {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::string data(const std::string& name) { return read_file(std::string(KILN_SOURCE_DIR) + "/tests/grammar/data/" + name); }

struct Vocab {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::shared_ptr<TokenTable> table;
};
const Vocab& vocab(const std::string& name) {
  static std::map<std::string, Vocab> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Vocab v;
  v.tok = tokenizer::Tokenizer::load_dir(std::string(KILN_SHARED_DIR) + "/fixtures/tokenizers/" + name);
  v.table = TokenTable::from_tokenizer(*v.tok);
  return cache.emplace(name, std::move(v)).first->second;
}

// Each token's bytes are what the decoder prints for it after other text (checked where the decode
// is whole characters; partial bytes decode as U+FFFD by design).
TEST(GrammarTokenTable, BytesMatchTheDecoder) {
  for (const char* name : {"llama3", "gpt2", "llama2"}) {
    const Vocab& v = vocab(name);
    const int32_t anchor = *v.tok->token_to_id("a");
    const std::string base = v.tok->decode(std::vector<int32_t>{anchor});
    int checked = 0;
    for (int32_t id = 0; id < v.table->vocab_size(); id += 7) {
      if (v.tok->is_special(id)) {
        EXPECT_TRUE(v.table->bytes(id).empty()) << name << " " << id;
        continue;
      }
      std::string text = v.tok->decode(std::vector<int32_t>{anchor, id});
      if (text.find("\xEF\xBF\xBD") != std::string::npos) continue;
      ASSERT_EQ(text.substr(0, base.size()), base);
      EXPECT_EQ(v.table->bytes(id), text.substr(base.size())) << name << " id " << id << " " << v.tok->id_to_token(id);
      ++checked;
    }
    EXPECT_GT(checked, v.table->vocab_size() / 10) << name;
  }
}

std::shared_ptr<const CompiledGrammar> schema(const std::string& text) {
  return std::make_shared<CompiledGrammar>(json_schema_grammar(text).grammar);
}
std::shared_ptr<const CompiledGrammar> corpus_schema(const std::string& file) {
  OrderedJson doc = OrderedJson::parse(read_file(std::string(KILN_SHARED_DIR) + "/fixtures/json_schemas/" + file));
  return std::make_shared<CompiledGrammar>(json_schema_grammar(doc["schema"]).grammar);
}

std::vector<int32_t> allowed(const Mask& m, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t id = 0; id < n; ++id)
    if (mask_test(m.data(), id)) out.push_back(id);
  return out;
}

// A random walk: allowed tokens at random; after `budget` steps, tokens that close things
// (quotes, brackets, newlines for line grammars) and the stop token are preferred so walks end.
struct Walk {
  std::string text;
  bool complete = false;
  int steps = 0, compared = 0;
};
Walk random_walk(const TokenMasker& tm, std::mt19937& rng, int budget, int compare_every, int max_steps = 600) {
  Matcher m(tm.grammar());
  const TokenTable& t = tm.table();
  Mask mask(t.mask_words()), brute(t.mask_words());
  Walk w;
  for (; w.steps < max_steps; ++w.steps) {
    tm.fill_mask(m, mask.data());
    if (compare_every > 0 && w.steps % compare_every == 0) {
      tm.fill_mask_brute(m, brute.data());
      EXPECT_EQ(allowed(mask, t.vocab_size()), allowed(brute, t.vocab_size())) << "at step " << w.steps << " after " << w.text;
      if (mask != brute) return w;
      ++w.compared;
    }
    std::vector<int32_t> ok = allowed(mask, t.vocab_size());
    if (ok.empty()) {
      ADD_FAILURE() << "no token allowed after " << w.text;
      return w;
    }
    bool stop_ok = m.is_complete() && !t.stop_ids().empty();
    if (w.steps >= budget) {
      if (stop_ok) {
        w.complete = true;
        return w;
      }
      std::vector<int32_t> closers;
      for (int32_t id : ok) {
        const std::string& b = t.bytes(id);
        if (!b.empty() && b.size() <= 3 && b.find_first_of("\"}]\n") != std::string::npos && b.find_first_of(",{[:") == std::string::npos)
          closers.push_back(id);
      }
      if (!closers.empty() && rng() % 4 != 0) ok = closers;
    } else if (stop_ok && rng() % 8 == 0) {
      w.complete = true;
      return w;
    }
    int32_t id = ok[rng() % ok.size()];
    if (!t.bytes(id).empty()) {
      EXPECT_TRUE(tm.accept_token(m, id));
      w.text += t.bytes(id);
    } else {  // a stop token
      w.complete = true;
      return w;
    }
  }
  return w;
}

TEST(GrammarTokenMask, EqualsBruteForceOnRandomStates) {
  struct G {
    const char* name;
    std::shared_ptr<const CompiledGrammar> g;
  };
  std::vector<G> grammars = {
      {"json.gbnf", std::make_shared<CompiledGrammar>(parse_gbnf(data("json.gbnf")))},
      {"arithmetic.gbnf", std::make_shared<CompiledGrammar>(parse_gbnf(data("arithmetic.gbnf")))},
      {"list.gbnf", std::make_shared<CompiledGrammar>(parse_gbnf(data("list.gbnf")))},
      {"person", schema(R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":150},
          "tags":{"type":"array","items":{"enum":["a","bb","ccc"]},"maxItems":3},"email":{"type":"string","format":"email"}},"required":["name","age"]})")},
      {"json_object", std::make_shared<CompiledGrammar>(json_object_grammar())},
      {"counted", schema(R"({"type":"array","items":{"anyOf":[{"type":"string","pattern":"^[a-z0-9 ]{1,90}$"},{"type":"string","maxLength":70}]}})")},
      {"Github_easy---o31175", corpus_schema("Github_easy---o31175.json")},
      {"Glaiveai2K---calculate_area_7003196f", corpus_schema("Glaiveai2K---calculate_area_7003196f.json")},
      {"JsonSchemaStore---chrome-manifest", corpus_schema("JsonSchemaStore---chrome-manifest.json")},
  };
  std::mt19937 rng(1234);
  for (const char* tname : {"gpt2", "llama2", "llama3"}) {
    const Vocab& v = vocab(tname);
    const bool big = v.table->vocab_size() > 100000;
    for (const G& g : grammars) {
      TokenMasker tm(g.g, v.table);
      int compared = 0, complete = 0;
      for (int walk = 0; walk < (big ? 2 : 3); ++walk) {
        Walk w = random_walk(tm, rng, big ? 16 : 24, big ? 5 : 3, big ? 80 : 200);
        compared += w.compared;
        complete += w.complete;
        if (HasFailure()) {
          ADD_FAILURE() << tname << " / " << g.name;
          return;
        }
      }
      printf("%s / %s: %d states compared, %d walks complete\n", tname, g.name, compared, complete);
      EXPECT_GT(compared, 0) << tname << " / " << g.name;
    }
  }
}

// Deep inside counted repetitions (states no token tells apart share their classes): every
// count from 0 to past the bound, against brute force.
TEST(GrammarTokenMask, CountedRepetitionsAtEveryCount) {
  const Vocab& v = vocab("gpt2");
  TokenMasker tm(schema(R"({"type":"array","items":{"anyOf":[{"type":"string","pattern":"^[a-z0-9 ]{1,90}$"},{"type":"string","maxLength":70}]}})"),
                 v.table);
  Matcher m(tm.grammar());
  ASSERT_TRUE(m.accept_bytes("[\""));
  Mask fast(v.table->mask_words()), brute(v.table->mask_words());
  for (int k = 0; k <= 92; ++k) {
    tm.fill_mask(m, fast.data());
    tm.fill_mask_brute(m, brute.data());
    ASSERT_EQ(allowed(fast, v.table->vocab_size()), allowed(brute, v.table->vocab_size())) << "after " << k << " characters";
    if (k < 92) {
      ASSERT_EQ(m.accept_bytes(k % 7 == 3 ? " " : "x"), k < 90) << k;
    }
  }
}

// Random walks until the stop token, and the output checked by nlohmann and by hand.
TEST(GrammarTokenMask, RandomWalksProduceValidJson) {
  const Vocab& v = vocab("llama3");
  struct S {
    const char* schema;
    std::function<bool(const nlohmann::json&)> check;
  };
  std::vector<S> cases = {
      {R"({"type":"object","properties":{"id":{"type":"integer","minimum":1,"maximum":999},"name":{"type":"string","minLength":1,"maxLength":8},
          "ok":{"type":"boolean"},"score":{"type":"number"}},"required":["id","name","ok"],"additionalProperties":false})",
       [](const nlohmann::json& j) {
         if (!j.is_object() || !j["id"].is_number_integer() || j["id"] < 1 || j["id"] > 999 || !j["ok"].is_boolean()) return false;
         if (!j["name"].is_string() || j["name"].get<std::string>().empty()) return false;
         for (auto it = j.begin(); it != j.end(); ++it)
           if (it.key() != "id" && it.key() != "name" && it.key() != "ok" && it.key() != "score") return false;
         return !j.contains("score") || j["score"].is_number();
       }},
      {R"({"type":"array","items":{"type":"object","properties":{"k":{"enum":["x","y"]},"v":{"type":["integer","null"],"minimum":-50,"maximum":50}},"required":["k","v"],
          "additionalProperties":false},"minItems":1,"maxItems":3})",
       [](const nlohmann::json& j) {
         if (!j.is_array() || j.empty() || j.size() > 3) return false;
         for (const auto& e : j)
           if (!e.is_object() || e.size() != 2 || (e["k"] != "x" && e["k"] != "y") ||
               !(e["v"].is_null() || (e["v"].is_number_integer() && e["v"] >= -50 && e["v"] <= 50)))
             return false;
         return true;
       }},
      {R"({"$defs":{"t":{"type":"object","properties":{"n":{"type":"string","pattern":"^[a-z]{1,4}$"},"c":{"type":"array","items":{"$ref":"#/$defs/t"},"maxItems":2}},
          "required":["n"],"additionalProperties":false}},"$ref":"#/$defs/t"})",
       [](const nlohmann::json& j) {
         std::function<bool(const nlohmann::json&, int)> ok = [&](const nlohmann::json& t, int d) {
           if (!t.is_object() || !t.contains("n") || !t["n"].is_string() || d > 50) return false;
           const std::string n = t["n"];
           if (n.empty() || n.size() > 4 || n.find_first_not_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos) return false;
           if (t.contains("c"))
             for (const auto& c : t["c"])
               if (!ok(c, d + 1)) return false;
           return true;
         };
         return ok(j, 0);
       }},
  };
  std::mt19937 rng(99);
  int done = 0;
  for (const S& c : cases) {
    TokenMasker tm(schema(c.schema), v.table);
    for (int walk = 0; walk < 6; ++walk) {
      Walk w = random_walk(tm, rng, 30, 0);
      ASSERT_TRUE(w.complete) << c.schema << "\n" << w.text;
      nlohmann::json j = nlohmann::json::parse(w.text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << w.text;
      EXPECT_TRUE(c.check(j)) << c.schema << "\n" << w.text;
      ++done;
    }
  }
  EXPECT_EQ(done, 18);
}

// Rolling back tokens gives back the earlier masks.
TEST(GrammarTokenMask, RollbackGivesTheEarlierMask) {
  const Vocab& v = vocab("gpt2");
  TokenMasker tm(std::make_shared<CompiledGrammar>(parse_gbnf(data("json.gbnf"))), v.table);
  Matcher m(tm.grammar());
  std::vector<int32_t> toks = v.tok->encode(R"({"a": [1, "é✓", {"b": null}], "c": true})", false);
  std::vector<Mask> masks;
  Mask mask(v.table->mask_words());
  for (int32_t id : toks) {
    tm.fill_mask(m, mask.data());
    ASSERT_TRUE(mask_test(mask.data(), id)) << v.tok->id_to_token(id);
    masks.push_back(mask);
    ASSERT_TRUE(tm.accept_token(m, id));
  }
  EXPECT_TRUE(m.is_complete());
  for (size_t back : {size_t{1}, size_t{3}, toks.size() / 2, toks.size()}) {
    Matcher r = m;
    r.rollback(back);
    tm.fill_mask(r, mask.data());
    EXPECT_EQ(mask, masks[toks.size() - back]) << "rolled back " << back;
  }
}

// Compiled once per source text, shared, bounded.
TEST(GrammarTokenMask, CacheCompilesOncePerSource) {
  GrammarCache cache(vocab("gpt2").table, 2);
  const std::string a = R"({"type":"object","properties":{"x":{"type":"string","format":"uri"}}})";
  CompiledSource c1 = cache.get(Source::json_schema, a);
  CompiledSource c2 = cache.get(Source::json_schema, a);
  EXPECT_EQ(c1.masker.get(), c2.masker.get());
  ASSERT_EQ(c1.warnings.size(), 1u);
  SchemaOptions strict;
  strict.strict = true;
  EXPECT_THROW(cache.get(Source::json_schema, a, strict), Error);  // other options, another entry: and an error
  EXPECT_EQ(cache.size(), 1u);
  cache.get(Source::gbnf, data("list.gbnf"));
  cache.get(Source::regex, "[0-9]+");
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NE(cache.get(Source::json_schema, a).masker.get(), c1.masker.get());  // evicted, compiled again
  Matcher m(cache.get(Source::json_object, "").masker->grammar());
  EXPECT_TRUE(m.accept_bytes("{}") && m.is_complete());
}

}  // namespace
}  // namespace kiln::grammar
