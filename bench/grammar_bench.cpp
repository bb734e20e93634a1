// Grammar engine timings over the JSON Schema corpus (shared/fixtures/json_schemas) at a tokenizer's
// vocabulary (default: the Llama 3 tokenizer, 128k tokens):
//   compile   schema -> Grammar -> CompiledGrammar (the parser tables and terminal DFAs);
//   masker    TokenMasker construction: the per-terminal token classes at DFA state 0 (cold for the
//             first schemas, then sharing the table's DFA walks, as a server would);
//   mask      fill_mask per token along random walks (random allowed tokens; after a budget,
//             closing tokens are preferred so walks end), every step timed.
// Issue 31's goals: mean mask < 50 us, p99 < 1 ms, compile p50 < 10 ms.
// Usage: grammar_bench [tokenizer_dir=<shared>/fixtures/tokenizers/llama3] [steps_per_schema=64] [max_schemas=all]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "kiln/base/error.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/token_mask.h"
#include "kiln/tokenizer/tokenizer.h"

#ifndef KILN_SHARED_DIR
#define KILN_SHARED_DIR "../shared"
#endif

using namespace kiln::grammar;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

struct Stats {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  double pct(double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
  }
  double mean() const {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / v.size();
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string tok_dir = argc > 1 ? argv[1] : std::string(KILN_SHARED_DIR) + "/fixtures/tokenizers/llama3";
  int steps = argc > 2 ? std::atoi(argv[2]) : 64;
  size_t max_schemas = argc > 3 ? std::stoul(argv[3]) : SIZE_MAX;
  const bool verbose = std::getenv("KILN_GRAMMAR_BENCH_VERBOSE") != nullptr;
  auto tok = kiln::tokenizer::Tokenizer::load_dir(tok_dir);
  auto t0 = Clock::now();
  auto table = TokenTable::from_tokenizer(*tok);
  std::printf("vocabulary: %s, %d tokens (table built in %.1f ms)\n", tok_dir.c_str(), table->vocab_size(), us_since(t0) / 1000);

  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(std::string(KILN_SHARED_DIR) + "/fixtures/json_schemas"))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.size() > max_schemas) files.resize(max_schemas);

  Stats compile, masker, mask, walk_len;
  int failed = 0, walks_complete = 0, uncertain_steps = 0;
  std::mt19937 rng(2024);
  Mask m(table->mask_words());
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    kiln::OrderedJson doc = kiln::OrderedJson::parse(ss.str());
    std::shared_ptr<const CompiledGrammar> g;
    t0 = Clock::now();
    try {
      g = std::make_shared<CompiledGrammar>(json_schema_grammar(doc["schema"]).grammar);
    } catch (const kiln::Error&) {
      ++failed;
      continue;
    }
    compile.add(us_since(t0));
    t0 = Clock::now();
    TokenMasker tm(g, table);
    masker.add(us_since(t0));
    Matcher mt(g);
    int s = 0;
    for (; s < steps; ++s) {
      size_t cached = tm.n_cached();
      t0 = Clock::now();
      tm.fill_mask(mt, m.data());
      double us = us_since(t0);
      mask.add(us);
      if (verbose && us > 500)
        std::fprintf(stderr, "slow mask %.0f us: %s step %d, %zu new classes, chart items %zu\n", us, f.filename().c_str(), s,
                     tm.n_cached() - cached, mt.chart().last().size());
      std::vector<int32_t> ok;
      for (size_t w = 0; w < m.size(); ++w)
        for (uint32_t bits = m[w]; bits; bits &= bits - 1) ok.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(bits)));
      if (ok.empty()) break;
      if (mt.is_complete() && (s > steps / 2 || rng() % 8 == 0)) {
        ++walks_complete;
        break;
      }
      if (s > steps / 2) {
        std::vector<int32_t> closers;
        for (int32_t id : ok) {
          const std::string& b = table->bytes(id);
          if (!b.empty() && b.size() <= 3 && b.find_first_of("\"}]") != std::string::npos && b.find_first_of(",{[:") == std::string::npos)
            closers.push_back(id);
        }
        if (!closers.empty() && rng() % 4 != 0) ok.swap(closers);
      }
      int32_t id = ok[rng() % ok.size()];
      if (table->bytes(id).empty() || !tm.accept_token(mt, id)) break;
    }
    walk_len.add(s);
  }
  (void)uncertain_steps;
  std::printf("schemas: %zu, compiled %zu, failed %d; walks: %d complete, mean length %.1f tokens\n", files.size(), compile.v.size(),
              failed, walks_complete, walk_len.mean());
  std::printf("%-28s %10s %10s %10s %10s %10s\n", "", "mean", "p50", "p90", "p99", "max");
  auto row = [](const char* name, Stats& s, double scale, const char* unit) {
    std::printf("%-28s %8.1f%s %8.1f%s %8.1f%s %8.1f%s %8.1f%s\n", name, s.mean() * scale, unit, s.pct(0.5) * scale, unit,
                s.pct(0.9) * scale, unit, s.pct(0.99) * scale, unit, s.pct(1.0) * scale, unit);
  };
  row("compile (schema -> tables)", compile, 1e-3, "ms");
  row("masker (token classes)", masker, 1e-3, "ms");
  row("mask per token", mask, 1, "us");
  std::printf("masks timed: %zu\n", mask.v.size());
  return 0;
}
