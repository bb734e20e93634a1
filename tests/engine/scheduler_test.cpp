// Scheduler and block manager, without a model: token budgets, chunked prefill mixed with
// decodes, the sequence limit, admission by free blocks, and preemption by recompute.
#include <gtest/gtest.h>

#include "kiln/engine/scheduler.h"

using namespace kiln::engine;

namespace {

std::unique_ptr<Sequence> make_seq(int64_t id, int n_prompt) {
  Request r;
  r.prompt.assign(n_prompt, 7);
  r.max_tokens = 100;
  return std::make_unique<Sequence>(id, std::move(r));
}

// Pretends the forward ran: advances n_computed and appends a sampled token where logits were wanted.
void complete(const std::vector<ScheduledChunk>& chunks) {
  for (auto& c : chunks) {
    c.seq->n_computed += c.n_tokens;
    if (c.wants_logits) c.seq->tokens.push_back(9);
  }
}

}  // namespace

TEST(BlockManager, EnsureAndRelease) {
  BlockManager bm(4, 16);
  std::vector<int32_t> blocks;
  EXPECT_TRUE(bm.ensure(blocks, 17));
  EXPECT_EQ(blocks.size(), 2u);
  EXPECT_EQ(bm.n_free(), 2);
  EXPECT_FALSE(bm.ensure(blocks, 16 * 5));  // would need 5
  EXPECT_EQ(blocks.size(), 2u);             // unchanged on failure
  bm.release(blocks);
  EXPECT_TRUE(blocks.empty());
  EXPECT_EQ(bm.n_free(), 4);
}

TEST(Scheduler, ChunkedPrefillWithinBudget) {
  BlockManager bm(64, 16);
  Scheduler s({/*max_batch_tokens=*/100, /*max_seqs=*/8}, bm);
  auto a = make_seq(1, 250);
  s.add(a.get());
  auto c1 = s.schedule();
  ASSERT_EQ(c1.size(), 1u);
  EXPECT_EQ(c1[0].n_tokens, 100);
  EXPECT_FALSE(c1[0].wants_logits);
  complete(c1);
  auto c2 = s.schedule();
  EXPECT_EQ(c2[0].n_tokens, 100);
  complete(c2);
  auto c3 = s.schedule();
  EXPECT_EQ(c3[0].n_tokens, 50);
  EXPECT_TRUE(c3[0].wants_logits);
  complete(c3);
  auto c4 = s.schedule();  // decode
  EXPECT_EQ(c4[0].n_tokens, 1);
  EXPECT_TRUE(c4[0].wants_logits);
}

TEST(Scheduler, DecodesMixWithPrefillAndRespectBudget) {
  BlockManager bm(64, 16);
  Scheduler s({64, 8}, bm);
  auto a = make_seq(1, 10), b = make_seq(2, 200);
  s.add(a.get());
  complete(s.schedule());  // a prefilled, has a sampled token pending
  s.add(b.get());
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].seq, a.get());
  EXPECT_EQ(c[0].n_tokens, 1);   // a decodes
  EXPECT_EQ(c[1].seq, b.get());
  EXPECT_EQ(c[1].n_tokens, 63);  // b's first chunk fills the rest of the budget
  int total = 0;
  for (auto& x : c) total += x.n_tokens;
  EXPECT_LE(total, 64);
}

TEST(Scheduler, SequenceLimit) {
  BlockManager bm(64, 16);
  Scheduler s({1000, 2}, bm);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int i = 0; i < 5; ++i) {
    seqs.push_back(make_seq(i, 5));
    s.add(seqs.back().get());
  }
  auto c = s.schedule();
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(s.running().size(), 2u);
  EXPECT_EQ(s.waiting().size(), 3u);
}

TEST(Scheduler, AdmissionWaitsForBlocks) {
  BlockManager bm(4, 16);  // 64 tokens of KV in all
  Scheduler s({1000, 8}, bm);
  auto a = make_seq(1, 40), b = make_seq(2, 40);
  s.add(a.get());
  s.add(b.get());
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 1u);  // b's 3 blocks do not fit beside a's 3
  EXPECT_EQ(s.waiting().size(), 1u);
  s.remove(a.get());       // a finishes: its blocks come back
  EXPECT_EQ(bm.n_free(), 4);
  auto c2 = s.schedule();
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_EQ(c2[0].seq, b.get());
}

TEST(Scheduler, PreemptsNewestByRecompute) {
  BlockManager bm(4, 4);  // 16 tokens of KV
  Scheduler s({1000, 8}, bm);
  auto a = make_seq(1, 7), b = make_seq(2, 7);
  s.add(a.get());
  s.add(b.get());
  complete(s.schedule());  // both prefilled: 2 blocks each, all 4 used; each has 8 tokens now
  EXPECT_EQ(bm.n_free(), 0);
  complete(s.schedule());  // both decode position 7, still inside their second block; 9 tokens each
  EXPECT_EQ(bm.n_free(), 0);
  // Next decode: a needs position 8 -> a third block; b (the newest) is preempted for it.
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].seq, a.get());
  EXPECT_EQ(b->n_computed, 0);     // recompute from scratch later
  EXPECT_EQ(b->tokens.size(), 9u);  // its generated tokens are kept
  EXPECT_EQ(b->n_preempted, 1);
  EXPECT_EQ(s.waiting().front(), b.get());
  EXPECT_EQ(s.n_preemptions(), 1);
}

TEST(Scheduler, RemoveFreesBlocksEverywhere) {
  BlockManager bm(8, 4);
  Scheduler s({1000, 8}, bm);
  auto a = make_seq(1, 9);
  s.add(a.get());
  s.schedule();
  EXPECT_EQ(bm.n_free(), 5);
  s.remove(a.get());
  EXPECT_EQ(bm.n_free(), 8);
  EXPECT_TRUE(s.empty());
}

TEST(Scheduler, PromptLogprobsPrefillRunsInBoundedChunks) {
  // Every prompt position's logits are returned for prompt logprobs: chunks stay <= 256 rows.
  BlockManager bm(64, 16);
  Scheduler s({1000, 8}, bm);
  Request r;
  r.prompt.assign(600, 7);
  r.prompt_logprobs = 0;
  Sequence a(1, std::move(r));
  s.add(&a);
  auto c = s.schedule();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].n_tokens, 256);
  EXPECT_FALSE(c[0].wants_logits);
  complete(c);
  complete(s.schedule());
  auto last = s.schedule();
  EXPECT_EQ(last[0].n_tokens, 600 - 512);
  EXPECT_TRUE(last[0].wants_logits);
}
