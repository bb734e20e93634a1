// The prefix cache without a model: full blocks stay after a sequence ends, keyed by the hash
// chain of their tokens; a later sequence with the same prefix starts from them; shared blocks
// are reference-counted; unreferenced cached blocks are evicted least-recently-used.
#include <gtest/gtest.h>

#include <numeric>

#include "kiln/engine/scheduler.h"

using namespace kiln::engine;

namespace {

std::unique_ptr<Sequence> make_seq(int64_t id, std::vector<int32_t> prompt) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = 100;
  return std::make_unique<Sequence>(id, std::move(r));
}

std::vector<int32_t> iota_tokens(int n, int start = 10) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Pretends the forward ran, as Engine::step does: advance, register full blocks, sample.
void complete(BlockManager& bm, const std::vector<ScheduledChunk>& chunks) {
  for (auto& c : chunks) {
    Sequence* s = c.seq;
    s->n_computed += c.n_tokens;
    bm.commit(s->tokens, s->n_computed, s->blocks, s->block_hashes, s->n_committed_blocks);
    if (c.wants_logits) s->tokens.push_back(9);
  }
}

}  // namespace

TEST(PrefixCache, SecondSequenceReusesFullBlocksOfTheFirst) {
  BlockManager bm(32, 4, {/*max_cached_blocks=*/16, /*model_key=*/1});
  Scheduler s({1000, 8}, bm);
  auto a = make_seq(1, iota_tokens(10));  // 2 full blocks + 2 tokens
  s.add(a.get());
  complete(bm, s.schedule());
  s.remove(a.get());
  EXPECT_EQ(bm.n_used(), 0);
  EXPECT_EQ(bm.n_cached(), 2);  // the two full blocks; the partial third is not kept

  std::vector<int32_t> p = iota_tokens(10);
  p.push_back(99);
  auto b = make_seq(2, p);
  s.add(b.get());
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(b->n_cached, 8);
  EXPECT_EQ(c[0].n_tokens, 3);  // only the uncached tail runs
  EXPECT_EQ(bm.hit_tokens(), 8);
  EXPECT_EQ(bm.n_cached(), 0);  // both cached blocks are referenced again
}

TEST(PrefixCache, DifferentPrefixOrModelDoesNotMatch) {
  BlockManager bm(32, 4, {16, 1});
  Scheduler s({1000, 8}, bm);
  auto a = make_seq(1, iota_tokens(9));
  s.add(a.get());
  complete(bm, s.schedule());
  s.remove(a.get());
  std::vector<int32_t> p = iota_tokens(9);
  p[1] = 500;  // differs in the first block: the chain breaks at once
  auto b = make_seq(2, p);
  s.add(b.get());
  s.schedule();
  EXPECT_EQ(b->n_cached, 0);

  BlockManager other(32, 4, {16, 2});  // same tokens, another model key
  std::vector<int32_t> blocks;
  std::vector<uint64_t> h1, h2;
  int n = 0;
  ASSERT_TRUE(other.ensure(blocks, 8));
  other.commit(iota_tokens(8), 8, blocks, h1, n);
  BlockManager same(32, 4, {16, 1});
  std::vector<int32_t> blocks2;
  int n2 = 0;
  ASSERT_TRUE(same.ensure(blocks2, 8));
  same.commit(iota_tokens(8), 8, blocks2, h2, n2);
  EXPECT_NE(h1, h2);
}

TEST(PrefixCache, AlwaysLeavesTheLastTokenToCompute) {
  BlockManager bm(32, 4, {16, 1});
  Scheduler s({1000, 8}, bm);
  auto a = make_seq(1, iota_tokens(8));  // exactly two blocks
  s.add(a.get());
  complete(bm, s.schedule());
  s.remove(a.get());
  auto b = make_seq(2, iota_tokens(8));  // the same prompt again
  s.add(b.get());
  auto c = s.schedule();
  EXPECT_EQ(b->n_cached, 4);  // one block reused; the second holds the last token, which must run
  EXPECT_EQ(c[0].n_tokens, 4);
  EXPECT_TRUE(c[0].wants_logits);
}

TEST(PrefixCache, SharedBlocksAreReferenceCounted) {
  BlockManager bm(32, 4, {16, 1});
  Scheduler s({1000, 8}, bm);
  auto a = make_seq(1, iota_tokens(9));
  s.add(a.get());
  complete(bm, s.schedule());
  int used_a = bm.n_used();  // a still runs
  auto b = make_seq(2, iota_tokens(9));
  s.add(b.get());
  s.schedule();
  EXPECT_EQ(b->n_cached, 8);
  EXPECT_EQ(b->blocks[0], a->blocks[0]);
  EXPECT_EQ(b->blocks[1], a->blocks[1]);
  EXPECT_EQ(bm.n_used(), used_a + 1);  // b added only its own third block
  s.remove(a.get());
  EXPECT_EQ(bm.n_cached(), 0);  // b still holds the shared blocks
  s.remove(b.get());
  EXPECT_EQ(bm.n_used(), 0);
  EXPECT_EQ(bm.n_cached(), 2);
}

TEST(PrefixCache, LeastRecentlyUsedIsEvictedUnderTheLimit) {
  BlockManager bm(64, 4, {/*max_cached_blocks=*/4, 1});
  Scheduler s({1000, 8}, bm);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int i = 0; i < 3; ++i) {  // three different 2-block prefixes, one after another
    seqs.push_back(make_seq(i, iota_tokens(9, 100 * (i + 1))));
    s.add(seqs.back().get());
    complete(bm, s.schedule());
    s.remove(seqs.back().get());
  }
  EXPECT_EQ(bm.n_cached(), 4);  // limit 4: the oldest prefix went
  auto first = make_seq(10, iota_tokens(9, 100));
  s.add(first.get());
  s.schedule();
  EXPECT_EQ(first->n_cached, 0);
  s.remove(first.get());
  auto last = make_seq(11, iota_tokens(9, 300));
  s.add(last.get());
  s.schedule();
  EXPECT_EQ(last->n_cached, 8);
}

TEST(PrefixCache, PoolPressureEvictsCachedBlocksBeforeFailing) {
  BlockManager bm(4, 4, {4, 1});
  Scheduler s({1000, 8}, bm);
  auto a = make_seq(1, iota_tokens(16, 100));  // fills all 4 blocks
  s.add(a.get());
  complete(bm, s.schedule());
  s.remove(a.get());
  EXPECT_EQ(bm.n_cached(), 4);
  EXPECT_EQ(bm.n_free(), 4);  // cached blocks still count as available
  auto b = make_seq(2, iota_tokens(12, 500));
  s.add(b.get());
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(bm.evictions(), 3);
  EXPECT_EQ(bm.n_cached(), 1);
}

TEST(PrefixCache, OffKeepsNothing) {
  BlockManager bm(8, 4);
  Scheduler s({1000, 8}, bm);
  auto a = make_seq(1, iota_tokens(9));
  s.add(a.get());
  complete(bm, s.schedule());
  s.remove(a.get());
  EXPECT_EQ(bm.n_cached(), 0);
  auto b = make_seq(2, iota_tokens(9));
  s.add(b.get());
  s.schedule();
  EXPECT_EQ(b->n_cached, 0);
}
