// The rotating KV cache (EngineConfig::max_kv_size, `--max-kv-size`) on the CPU with stories260K:
// with room for everything it generates exactly what the plain cache does; with max_kv_size 64 a
// 400-token generation holds a bounded number of blocks and generates exactly what a dense
// reference does (ModelRunner over a cache that keeps every block, the same mask: first 4 + last
// 60), whose logits past 64 tokens differ from the unmasked model's (the mask is in effect); only
// blocks before max_kv_size enter the prefix cache; bad settings and rollback past the window fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/engine/model_runner.h"
#include "kiln/engine/speculative.h"

using namespace kiln;
using namespace kiln::engine;

namespace {

std::unique_ptr<LoadedModel> stories() {
  const char* e = std::getenv("KILN_SHARED_DIR");
  return load_model(std::string(e ? e : KILN_SHARED_DIR) + "/models/stories260K", {});
}

std::vector<int32_t> prompt(int n) {
  std::vector<int32_t> t{1};
  for (int i = 1; i < n; ++i) t.push_back(static_cast<int32_t>(20 + (i * 37) % 400));
  return t;
}

struct GenRun {
  std::vector<int32_t> tokens;  // generated
  int max_used = 0;             // blocks held by the sequence, the most at any step
  int n_cached_after = 0;       // prefix-cache blocks once it ended
};

// Greedy generation of n tokens through the engine (no stop ids, so exactly n).
GenRun generate(LoadedModel& m, const std::vector<int32_t>& p, int n, int max_kv_size, size_t prompt_cache_bytes = 0) {
  EngineConfig ec;
  ec.block_size = 16;
  ec.max_kv_size = max_kv_size;
  ec.prompt_cache_bytes = prompt_cache_bytes;
  Engine eng(*m.model, ec);
  GenRun run;
  Request r;
  r.prompt = p;
  r.max_tokens = n;
  r.on_event = [&](const TokenEvent& e) {
    if (e.token >= 0) run.tokens.push_back(e.token);
  };
  eng.add(std::move(r));
  while (eng.has_work()) {
    eng.step();
    run.max_used = std::max(run.max_used, eng.blocks().n_used());
  }
  run.n_cached_after = eng.blocks().n_cached();
  return run;
}

// The dense reference: one token per step (prompt included) over a cache holding every block of
// the sequence, with the rotating mask of max_kv_size (0: none); the greedy token after the prompt
// and after each token it adds, n of them, and their logits.
std::vector<int32_t> dense(model::Model& m, std::vector<int32_t> tokens, int n, int max_kv_size,
                           std::vector<std::vector<float>>* logits = nullptr) {
  const int bs = 16, n_blocks = (static_cast<int>(tokens.size()) + n + bs) / bs;
  auto kv = model::KvCache::allocate(m.backend(), m.config(), n_blocks, bs);
  kv.max_kv_size = max_kv_size;
  ModelRunner r(m, kv);
  std::vector<int32_t> blocks(n_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::vector<int32_t> out;
  for (int pos = 0; static_cast<int>(out.size()) < n; ++pos) {
    SeqChunk c{tokens, pos, 1, blocks, 1, nullptr};
    Tensor l = r.logits({&c, 1});
    if (pos + 1 < static_cast<int>(tokens.size())) continue;  // a prompt token
    const float* row = l.ptr<float>();
    const int32_t tok = static_cast<int32_t>(std::max_element(row, row + l.numel()) - row);
    if (logits) logits->emplace_back(row, row + l.numel());
    out.push_back(tok);
    tokens.push_back(tok);
  }
  return out;
}

}  // namespace

TEST(RotatingCache, WithRoomForEverythingEqualsThePlainCache) {
  auto m = stories();
  const std::vector<int32_t> p = prompt(9);
  const GenRun plain = generate(*m, p, 120, 0), rotating = generate(*m, p, 120, 129 + 16);
  ASSERT_EQ(plain.tokens.size(), 120u);
  EXPECT_EQ(rotating.tokens, plain.tokens);
}

TEST(RotatingCache, LongGenerationHoldsBoundedBlocksAndMatchesTheDenseReference) {
  auto m = stories();
  const std::vector<int32_t> p = prompt(9);
  constexpr int kM = 64, kN = 400;
  const GenRun rotating = generate(*m, p, kN, kM);
  ASSERT_EQ(rotating.tokens.size(), static_cast<size_t>(kN));
  // Blocks of 16: the one of the first 4 tokens, and the window of 60 keys plus the next token's
  // row: at most ceil(61 / 16) + 1 = 5 blocks of the window. The plain cache holds 26 at the end.
  EXPECT_LE(rotating.max_used, 6);
  EXPECT_GE(rotating.max_used, 5);
  const GenRun plain = generate(*m, p, kN, 0);
  EXPECT_EQ(plain.max_used, (9 + kN + 15) / 16);

  // The same mask with every block kept: the tokens must match (freeing only dropped blocks no
  // token read).
  std::vector<std::vector<float>> rot_logits, full_logits;
  const std::vector<int32_t> ref = dense(*m->model, p, kN, kM, &rot_logits);
  EXPECT_EQ(rotating.tokens, ref);
  EXPECT_EQ(plain.tokens, dense(*m->model, p, kN, 0));
  // And the mask is in effect: along the rotated sequence, the unmasked model's logits differ
  // once it is past 64 tokens (and agree before).
  std::vector<int32_t> forced = p;
  forced.insert(forced.end(), ref.begin(), ref.end());
  auto kv = model::KvCache::allocate(m->model->backend(), m->config, 32, 16);
  ModelRunner r(*m->model, kv);
  std::vector<int32_t> blocks(32);
  std::iota(blocks.begin(), blocks.end(), 0);
  const int n_rows = static_cast<int>(forced.size()) - static_cast<int>(p.size()) + 1;
  SeqChunk all{forced, 0, static_cast<int>(forced.size()), blocks, n_rows, nullptr};
  StepOutput out = r.run({&all, 1});
  double before = 0, after = 0;  // max |logit difference| at positions < 64 and >= 64
  for (int i = 0; i < kN; ++i) {
    const int pos = static_cast<int>(p.size()) - 1 + i;
    for (size_t v = 0; v < rot_logits[i].size(); ++v) {
      const double d = std::abs(out.row(i)[v] - rot_logits[i][v]);
      (pos < kM ? before : after) = std::max(pos < kM ? before : after, d);
    }
  }
  EXPECT_LT(before, 1e-3);
  EXPECT_GT(after, 1e-2);
}

TEST(RotatingCache, OnlyBlocksBeforeMaxKvSizeEnterThePrefixCache) {
  auto m = stories();
  const std::vector<int32_t> p = prompt(9);
  const GenRun rotating = generate(*m, p, 200, 64, 1 << 20);
  EXPECT_EQ(rotating.n_cached_after, 64 / 16);
  const GenRun plain = generate(*m, p, 200, 0, 1 << 20);
  EXPECT_EQ(plain.n_cached_after, (9 + 200 - 1) / 16);  // every full block (the last token has no K/V)
}

TEST(RotatingCache, PromptsLongerThanTheWindowPrefillInBoundedBlocks) {
  auto m = stories();
  // A 300-token prompt with max_kv_size 64 prefills in one chunk under the mask, then decodes; the
  // tokens equal the dense reference's.
  const std::vector<int32_t> p = prompt(300);
  const GenRun rotating = generate(*m, p, 40, 64);
  EXPECT_EQ(rotating.tokens, dense(*m->model, p, 40, 64));
  EXPECT_LE(rotating.max_used, (300 + 15) / 16 + 1);
}

TEST(RotatingCache, RefusesBadSettingsSpeculationAndRollbackPastTheWindow) {
  auto m = stories();
  for (int bad : {-1, 1, 4}) {
    EngineConfig ec;
    ec.max_kv_size = bad;
    try {
      Engine eng(*m->model, ec);
      ADD_FAILURE() << "max_kv_size " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("max_kv_size is " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  auto ngram = make_ngram_draft();
  EngineConfig spec;
  spec.max_kv_size = 64;
  spec.spec.draft = ngram.get();
  try {
    Engine eng(*m->model, spec);
    ADD_FAILURE() << "speculative decoding with a rotating cache was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("speculative decoding"), std::string::npos) << e.what();
  }

  EngineConfig ec;
  ec.block_size = 4;
  ec.max_kv_size = 16;
  Engine eng(*m->model, ec);
  Request r;
  r.prompt = prompt(5);
  r.max_tokens = 40;
  const int64_t id = eng.add(std::move(r));
  for (int i = 0; i < 5; ++i) eng.step();
  EXPECT_NO_THROW(eng.rollback(id, 1));  // 9 tokens: nothing given back yet
  for (int i = 0; i < 20; ++i) eng.step();
  EXPECT_THROW(eng.rollback(id, 1), Error);
}
