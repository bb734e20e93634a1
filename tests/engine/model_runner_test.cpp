// The ModelRunner on the CPU with stories260K: a ragged batch where one sequence asks logits for 5
// positions and two others for 1 equals running each position alone (one token per step, its own
// cache); a logits processor is applied before sampling; rolling a sequence back (generate, roll
// back, regenerate) gives the same tokens, and the prefix cache never serves a rolled-back block.
// BlockManager::truncate is checked without a model (shared blocks are copied, not rewritten).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/engine/model_runner.h"

using namespace kiln;
using namespace kiln::engine;

namespace {

std::unique_ptr<LoadedModel> stories() {
  const char* e = std::getenv("KILN_SHARED_DIR");
  return load_model(std::string(e ? e : KILN_SHARED_DIR) + "/models/stories260K", {});
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> t{1};
  for (int i = 1; i < n; ++i) t.push_back(static_cast<int32_t>(20 + (i * 37 + salt * 11) % 400));
  return t;
}

std::vector<int32_t> iota_blocks(int begin, int n) {
  std::vector<int32_t> b(n);
  std::iota(b.begin(), b.end(), begin);
  return b;
}

// Logits [tokens.size(), vocab] of every position, one token per step in a fresh cache.
std::vector<std::vector<float>> one_at_a_time(model::Model& m, const std::vector<int32_t>& tokens) {
  auto kv = model::KvCache::allocate(m.backend(), m.config(), 8, 4);
  ModelRunner r(m, kv);
  const std::vector<int32_t> blocks = iota_blocks(0, 8);
  std::vector<std::vector<float>> rows;
  for (int p = 0; p < static_cast<int>(tokens.size()); ++p) {
    SeqChunk c{tokens, p, 1, blocks, 1, nullptr};
    Tensor l = r.logits({&c, 1});
    rows.emplace_back(l.ptr<float>(), l.ptr<float>() + l.numel());
  }
  return rows;
}

// max |a - b| over the row, relative to the range of b.
double rel_err(std::span<const float> a, const std::vector<float>& b) {
  double err = 0;
  const auto [lo, hi] = std::minmax_element(b.begin(), b.end());
  for (size_t i = 0; i < b.size(); ++i) err = std::max(err, static_cast<double>(std::abs(a[i] - b[i])));
  return err / std::max(1e-6, static_cast<double>(*hi - *lo));
}

}  // namespace

TEST(ModelRunner, SeveralLogitRowsOfOneSequenceEqualEachPositionAlone) {
  auto m = stories();
  const std::vector<int32_t> a = prompt(12, 1), b = prompt(7, 2), c = prompt(9, 3);
  auto kv = model::KvCache::allocate(m->model->backend(), m->config, 24, 4);
  ModelRunner r(*m->model, kv);
  const std::vector<int32_t> ba = iota_blocks(0, 3), bb = iota_blocks(8, 2), bc = iota_blocks(16, 3);
  // b runs as a prefill then a decode step, so the batch mixes a 5-row chunk with 1-row chunks
  // that start past position 0.
  SeqChunk pre{b, 0, 5, bb, 1, nullptr};
  r.logits({&pre, 1});
  const SeqChunk chunks[] = {{a, 0, 12, ba, 5, nullptr}, {b, 5, 2, bb, 1, nullptr}, {c, 0, 9, bc, 1, nullptr}};
  StepOutput out = r.run(chunks);
  ASSERT_EQ(out.logits.dim(0), 7);
  EXPECT_EQ(out.first_row, (std::vector<int>{0, 5, 6}));
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{-1, -1, -1}));  // nothing sampled

  const auto ra = one_at_a_time(*m->model, a), rb = one_at_a_time(*m->model, b), rc = one_at_a_time(*m->model, c);
  for (int j = 0; j < 5; ++j) EXPECT_LT(rel_err(out.row(j), ra[7 + j]), 1e-4) << "row " << j;
  EXPECT_LT(rel_err(out.row(5), rb[6]), 1e-4);
  EXPECT_LT(rel_err(out.row(6), rc[8]), 1e-4);
}

TEST(ModelRunner, ProcessorsChangeTheRowBeforeSampling) {
  // A processor that bans the greedy token: the runner samples the runner-up, and the returned
  // row holds the processed logits.
  struct Ban : LogitsProcessor {
    int32_t id;
    explicit Ban(int32_t i) : id(i) {}
    void process(std::span<float> l, std::span<const int32_t>) override { l[id] = -INFINITY; }
  };
  auto m = stories();
  const std::vector<int32_t> a = prompt(6, 4);
  const auto ref = one_at_a_time(*m->model, a).back();
  const int32_t best = static_cast<int32_t>(std::max_element(ref.begin(), ref.end()) - ref.begin());
  std::vector<float> second = ref;
  second[best] = -INFINITY;
  const int32_t runner_up = static_cast<int32_t>(std::max_element(second.begin(), second.end()) - second.begin());

  auto kv = model::KvCache::allocate(m->model->backend(), m->config, 8, 4);
  ModelRunner r(*m->model, kv);
  const std::vector<int32_t> blocks = iota_blocks(0, 8);
  Sampler greedy({});
  Ban ban(best);
  LogitsProcessor* procs[] = {&ban};
  SampleSpec spec{&greedy, a, {}, procs, false};
  SeqChunk c{a, 0, 6, blocks, 1, &spec};
  StepOutput out = r.run({&c, 1});
  EXPECT_EQ(out.tokens[0], runner_up);
  EXPECT_EQ(out.row(0)[best], -INFINITY);
}

TEST(ModelRunner, RollbackRegeneratesTheSameTokensAndLeavesNothingInThePrefixCache) {
  auto m = stories();
  EngineConfig ec;
  ec.block_size = 4;
  ec.n_blocks = 64;
  ec.prompt_cache_bytes = 1 << 20;
  const std::vector<int32_t> p = prompt(8, 5);
  auto generate = [&](Engine& eng, int rollback_at, int k, std::vector<int32_t>* tokens) {
    Request q;
    q.prompt = p;
    q.max_tokens = 20;
    q.on_event = [tokens](const TokenEvent& e) {
      if (e.token >= 0) tokens->push_back(e.token);
    };
    const int64_t id = eng.add(std::move(q));
    bool done = false;
    while (eng.has_work()) {
      eng.step();
      if (!done && static_cast<int>(tokens->size()) == rollback_at) {
        eng.rollback(id, k);
        tokens->resize(tokens->size() - k);
        done = true;
      }
    }
  };
  std::vector<int32_t> plain, rolled;
  {
    Engine eng(*m->model, ec);
    generate(eng, -1, 0, &plain);
  }
  {
    Engine eng(*m->model, ec);
    generate(eng, 12, 6, &rolled);  // 12 generated: 20 tokens, 4 full blocks committed; back to 14
  }
  ASSERT_EQ(plain.size(), 20u);
  EXPECT_EQ(rolled, plain);

  // Rolled back and cancelled: the partly kept block (tokens 12..15) and the one after it leave the
  // prefix cache; a new request with the old 17 tokens finds only the 3 blocks before them.
  Engine eng(*m->model, ec);
  std::vector<int32_t> got;
  Request q;
  q.prompt = p;
  q.max_tokens = 20;
  q.on_event = [&](const TokenEvent& e) {
    if (e.token >= 0) got.push_back(e.token);
  };
  const int64_t id = eng.add(std::move(q));
  while (got.size() < 12) eng.step();
  eng.rollback(id, 6);
  eng.cancel(id);
  std::vector<int32_t> old(p);
  old.insert(old.end(), plain.begin(), plain.begin() + 9);  // 17 tokens
  Request again;
  again.prompt = old;
  again.max_tokens = 1;
  int cached = -1;
  again.on_event = [&](const TokenEvent& e) { cached = e.n_cached; };
  eng.add(std::move(again));
  while (eng.has_work()) eng.step();
  EXPECT_EQ(cached, 12);
}

TEST(BlockManagerTruncate, ForgetsRolledBackBlocksAndCopiesSharedOnes) {
  BlockManager bm(16, 4, {/*max_cached_blocks=*/8, /*model_key=*/3});
  std::vector<int32_t> tokens(16);
  std::iota(tokens.begin(), tokens.end(), 100);
  std::vector<int32_t> blocks;
  std::vector<uint64_t> hashes;
  int committed = 0;
  ASSERT_TRUE(bm.ensure(blocks, 16));
  bm.commit(tokens, 16, blocks, hashes, committed);
  EXPECT_EQ(committed, 4);

  // Another sequence shares the first 3 blocks.
  std::vector<int32_t> other;
  std::vector<uint64_t> other_hashes;
  EXPECT_EQ(bm.acquire_prefix(std::span<const int32_t>(tokens).first(13), 3, other, other_hashes), 3);

  // Back to 10 tokens: block 3 goes (forgotten), block 2 keeps 2 rows but is shared: copy it.
  const int32_t old2 = blocks[2];
  EXPECT_EQ(bm.truncate(blocks, 10, hashes, committed), old2);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_NE(blocks[2], old2);
  EXPECT_EQ(committed, 2);
  EXPECT_EQ(hashes.size(), 2u);

  // Unshared, partly kept: it leaves the cache and stays ours (nothing to copy).
  const int32_t mine = blocks[2];
  EXPECT_EQ(bm.truncate(blocks, 9, hashes, committed), -1);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[2], mine);

  bm.release(other);
  bm.release(blocks);
  // What is left cached: blocks 0..2 of the shared prefix, never the rolled-back block 3.
  std::vector<int32_t> probe;
  std::vector<uint64_t> probe_hashes;
  EXPECT_EQ(bm.acquire_prefix(tokens, 4, probe, probe_hashes), 3);
}
