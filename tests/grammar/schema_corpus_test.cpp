// The JSON Schema corpus (../shared/fixtures/json_schemas: 405 MaskBench schemas, each with valid and
// invalid instances; PROVENANCE.md there). For every schema that compiles, each valid instance,
// serialized compactly (nlohmann dump(), keys in the instance's order), must be accepted byte by byte
// and complete the grammar; each invalid instance must be rejected when the schema compiled without
// warnings (every keyword enforced). The counts are printed and held to floors: a regression fails.
// KILN_GRAMMAR_CORPUS_VERBOSE=1 lists the misses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "kiln/base/error.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/matcher.h"

namespace kiln::grammar {
namespace {

namespace fs = std::filesystem;

// Floors: the counts this engine reaches (raise them when it improves).
constexpr int kFloorCompiled = 402, kFloorValid = 471, kFloorInvalid = 578;

TEST(GrammarSchemaCorpus, ValidAcceptedInvalidRejected) {
  const fs::path dir = fs::path(KILN_SHARED_DIR) / "fixtures" / "json_schemas";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 400u);
  const bool verbose = std::getenv("KILN_GRAMMAR_CORPUS_VERBOSE") != nullptr;

  int pretty_ok = 0, pretty_mismatch = 0;
  int compiled = 0, no_warnings = 0, valid = 0, valid_ok = 0, invalid_checked = 0, invalid_ok = 0, invalid_all = 0;
  std::map<std::string, int> failures;  // why a schema did not compile (first words)
  std::map<std::string, int> warned;    // what was not enforced
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    OrderedJson doc = OrderedJson::parse(ss.str());
    std::shared_ptr<const CompiledGrammar> g;
    std::vector<std::string> warnings;
    try {
      SchemaGrammar sg = json_schema_grammar(doc["schema"]);
      warnings = sg.warnings;
      g = std::make_shared<CompiledGrammar>(sg.grammar);
    } catch (const Error& e) {
      std::string w = e.what();
      failures[w.substr(0, std::min<size_t>(w.size(), 60))]++;
      if (verbose) fprintf(stderr, "NOCOMPILE %s: %s\n", f.filename().c_str(), e.what());
      for (const auto& t : doc["tests"]) (t["valid"].get<bool>() ? valid : invalid_all)++;
      continue;
    }
    ++compiled;
    // The same schema with whitespace allowed takes the instances pretty-printed.
    SchemaOptions ws;
    ws.whitespace = true;
    auto gw = std::make_shared<CompiledGrammar>(json_schema_grammar(doc["schema"], ws).grammar);
    for (const auto& t : doc["tests"]) {
      if (!t["valid"].get<bool>()) continue;
      Matcher compact(g), pretty(gw), pretty_compact(gw);
      bool c = compact.accept_bytes(t["data"].dump()) && compact.is_complete();
      bool p = pretty.accept_bytes(t["data"].dump(2)) && pretty.is_complete();
      bool pc = pretty_compact.accept_bytes(t["data"].dump()) && pretty_compact.is_complete();
      pretty_ok += p;
      if (c != p || c != pc) {
        ++pretty_mismatch;
        if (verbose) fprintf(stderr, "WHITESPACE %s: compact %d pretty %d\n", f.filename().c_str(), c, p);
      }
    }
    if (warnings.empty()) ++no_warnings;
    for (const auto& w : warnings) warned[w.substr(0, w.find(" at "))]++;
    for (const auto& t : doc["tests"]) {
      std::string text = t["data"].dump();
      Matcher m(g);
      bool ok = m.accept_bytes(text) && m.is_complete();
      if (t["valid"].get<bool>()) {
        ++valid;
        valid_ok += ok;
        if (!ok && verbose) fprintf(stderr, "REJECTED-VALID %s: %.300s\n", f.filename().c_str(), text.c_str());
      } else {
        ++invalid_all;
        if (!warnings.empty()) continue;
        ++invalid_checked;
        invalid_ok += !ok;
        if (ok && verbose) fprintf(stderr, "ACCEPTED-INVALID %s (%s): %.300s\n", f.filename().c_str(),
                                   t.value("description", "").c_str(), text.c_str());
      }
    }
  }
  printf("schema corpus: %zu schemas, %d compiled (%d without warnings); valid instances accepted %d/%d; "
         "invalid instances rejected %d/%d checked (of %d)\n",
         files.size(), compiled, no_warnings, valid_ok, valid, invalid_ok, invalid_checked, invalid_all);
  printf("  with whitespace allowed: %d valid instances accepted pretty-printed (dump(2)), %d differ from compact\n", pretty_ok,
         pretty_mismatch);
  EXPECT_EQ(pretty_mismatch, 0);
  for (const auto& [why, n] : failures) printf("  not compiled x%d: %s\n", n, why.c_str());
  for (const auto& [what, n] : warned) printf("  not enforced in %d schemas: %s\n", n, what.c_str());
  EXPECT_GE(compiled, kFloorCompiled);
  EXPECT_GE(valid_ok, kFloorValid);
  EXPECT_GE(invalid_ok, kFloorInvalid);
  EXPECT_EQ(invalid_ok, invalid_checked) << "an invalid instance accepted although every keyword was enforced";
}

}  // namespace
}  // namespace kiln::grammar
