// KV pool sizing (engine/kv_sizing.h) without a GPU: the plan from the workload's wish, an
// explicit --kv-cache-bytes, the prefix cache's share, and the --gpu-memory-utilization budget
// on made-up device numbers; the byte estimates from a real config.
#include <gtest/gtest.h>

#include "kiln/engine/kv_sizing.h"

using namespace kiln;
using namespace kiln::engine;

namespace {

constexpr size_t kGB = 1000ull * 1000 * 1000;
constexpr size_t kMB = 1000ull * 1000;

KvPoolRequest gpu_request() {
  KvPoolRequest r;
  r.bytes_per_block = 2 * kMB;
  r.wanted_blocks = 1000;  // 2 GB
  r.gpu_memory_utilization = 0.75;  // exact in binary: the expectations below are exact
  r.device_total = 100 * kGB;
  r.device_free = 80 * kGB;  // 20 GB in use (weights, context)
  r.activation_reserve = 5 * kGB;
  return r;
}

TEST(KvSizing, HostBackendTakesTheWishOrTheExplicitBytes) {
  KvPoolRequest r;
  r.bytes_per_block = 1000;
  r.wanted_blocks = 37;
  r.gpu_memory_utilization = 0.5;  // ignored: no device
  KvPoolPlan p = plan_kv_pool(r);
  EXPECT_EQ(p.active_blocks, 37);
  EXPECT_EQ(p.cached_blocks, 0);
  EXPECT_FALSE(p.capped);
  r.kv_cache_bytes = 12'345;  // 12 whole blocks; overrides the wish
  p = plan_kv_pool(r);
  EXPECT_EQ(p.active_blocks, 12);
  r.prompt_cache_bytes = 1'000'000;  // 1000 blocks wished, at most 4x the active pool
  EXPECT_EQ(plan_kv_pool(r).cached_blocks, 48);
  r.prompt_cache_bytes = 5'500;
  EXPECT_EQ(plan_kv_pool(r).cached_blocks, 5);
}

TEST(KvSizing, ExplicitBytesBelowOneBlockFail) {
  KvPoolRequest r;
  r.bytes_per_block = 1000;
  r.kv_cache_bytes = 999;
  EXPECT_THROW(plan_kv_pool(r), Error);
}

TEST(KvSizing, BudgetCapsTheWish) {
  KvPoolRequest r = gpu_request();
  // budget = 0.75 * 100 - 20 - 5 = 50 GB: the 2 GB wish fits, uncapped.
  KvPoolPlan p = plan_kv_pool(r);
  EXPECT_EQ(p.active_blocks, 1000);
  EXPECT_FALSE(p.capped);
  EXPECT_EQ(p.budget_bytes, 50 * kGB);
  // A wish of 100 GB is cut to the 50 GB budget.
  r.wanted_blocks = 50'000;
  p = plan_kv_pool(r);
  EXPECT_TRUE(p.capped);
  EXPECT_EQ(p.active_blocks, 25'000);
  EXPECT_EQ(p.cached_blocks, 0);
  // A lower fraction gives a smaller pool: 0.5 * 100 - 25 = 25 GB.
  r.gpu_memory_utilization = 0.5;
  EXPECT_EQ(plan_kv_pool(r).active_blocks, 12'500);
}

TEST(KvSizing, PrefixCacheGetsWhatTheBudgetLeaves) {
  KvPoolRequest r = gpu_request();
  r.wanted_blocks = 20'000;           // 40 GB of the 50 GB budget
  r.prompt_cache_bytes = 20 * kGB;    // wishes 10000 blocks, 5000 fit
  KvPoolPlan p = plan_kv_pool(r);
  EXPECT_EQ(p.active_blocks, 20'000);
  EXPECT_EQ(p.cached_blocks, 5'000);
  EXPECT_LE((p.active_blocks + p.cached_blocks) * r.bytes_per_block, p.budget_bytes);
}

TEST(KvSizing, ADraftsKvCountsInActiveBlocksOnly) {
  // Active blocks hold the target's and a draft model's K/V (3 MB); prefix-cache blocks only the
  // target's (2 MB). 40 GB budget for 10000 active blocks leaves 10 GB: 5000 cached blocks.
  KvPoolRequest r = gpu_request();
  r.bytes_per_block = 3 * kGB / 1000;
  r.cached_bytes_per_block = 2 * kGB / 1000;
  r.wanted_blocks = 40 * kGB / r.bytes_per_block;
  r.prompt_cache_bytes = 20 * kGB;
  KvPoolPlan p = plan_kv_pool(r);
  EXPECT_EQ(p.active_blocks, r.wanted_blocks);
  EXPECT_EQ(p.cached_blocks, static_cast<int>((p.budget_bytes - p.active_blocks * r.bytes_per_block) / r.cached_bytes_per_block));
  EXPECT_LE(p.active_blocks * r.bytes_per_block + p.cached_blocks * r.cached_bytes_per_block, p.budget_bytes);
  EXPECT_GT(p.cached_blocks, (p.budget_bytes - p.active_blocks * r.bytes_per_block) / r.bytes_per_block);
}

TEST(KvSizing, BudgetNeverExceedsFreeMemory) {
  KvPoolRequest r = gpu_request();
  r.device_free = 10 * kGB;  // another process holds most of the device
  r.wanted_blocks = 1'000'000;
  // 0.75 * 100 - 90 - 5 < 0: nothing fits, and the message says what to do.
  try {
    plan_kv_pool(r);
    FAIL() << "expected a failure";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu-memory-utilization"), std::string::npos) << e.what();
  }
  r.gpu_memory_utilization = 1.0;  // 100 - 90 - 5 = 5 GB, and 10 - 5 free after the reserve
  KvPoolPlan p = plan_kv_pool(r);
  EXPECT_EQ(p.active_blocks, static_cast<int>(5 * kGB / (2 * kMB)));
  EXPECT_TRUE(p.capped);
}

TEST(KvSizing, ExplicitBytesOnTheDeviceMustFitFreeMemory) {
  KvPoolRequest r = gpu_request();
  r.gpu_memory_utilization = 0.1;  // does not apply to an explicit size
  r.kv_cache_bytes = 70 * kGB;     // fits the 80 - 5 GB free after the reserve
  KvPoolPlan p = plan_kv_pool(r);
  EXPECT_EQ(p.active_blocks, static_cast<int>(70 * kGB / (2 * kMB)));
  r.prompt_cache_bytes = 50 * kGB;  // only 5 GB are left for it
  EXPECT_EQ(plan_kv_pool(r).cached_blocks, static_cast<int>(5 * kGB / (2 * kMB)));
  r.kv_cache_bytes = 76 * kGB;
  try {
    plan_kv_pool(r);
    FAIL() << "expected a failure";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-bytes"), std::string::npos) << e.what();
  }
}

TEST(KvSizing, RejectsAFractionAboveOne) {
  KvPoolRequest r = gpu_request();
  r.gpu_memory_utilization = 1.5;
  EXPECT_THROW(plan_kv_pool(r), Error);
}

TEST(KvSizing, RowsThatFitCutTheBatch) {
  KvPoolRequest r;
  r.bytes_per_block = 1000;
  EXPECT_EQ(rows_that_fit(r, 32, 8), 8);  // host, no explicit size: the whole batch
  r.kv_cache_bytes = 100'000;             // 100 blocks: 3 rows of 32
  EXPECT_EQ(rows_that_fit(r, 32, 8), 3);
  r.kv_cache_bytes = 20'000;              // not one row
  EXPECT_THROW(rows_that_fit(r, 32, 8), Error);
  KvPoolRequest g = gpu_request();        // 50 GB budget = 25000 blocks of 2 MB
  EXPECT_EQ(rows_that_fit(g, 10'000, 8), 2);
}

TEST(KvSizing, BytesPerBlockAndReserveFollowTheConfig) {
  model::ModelConfig c;  // llama-3-8b's shape
  c.n_layers = 32;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.dim = 4096;
  c.ffn_dim = 14336;
  c.vocab_size = 128256;
  // 2 x 32 layers x 16 tokens x 1024 x 2 bytes = 2 MiB per block (128 KiB per token).
  EXPECT_EQ(kv_bytes_per_block(c, 16, 2), 2ull << 20);
  EXPECT_EQ(kv_bytes_per_block(c, 16, 4), 4ull << 20);
  const size_t r2048 = activation_reserve_bytes(c, 2048, 2), r512 = activation_reserve_bytes(c, 512, 2);
  // Logits alone for 2048 tokens are 2048 x 128256 x 4 bytes ~ 1.05 GB; the estimate holds them.
  EXPECT_GT(r2048, 2048ull * 128256 * 4);
  EXPECT_LT(r2048, 4 * kGB);
  EXPECT_GT(r2048, r512);
  // MoE: the experts' rows raise it.
  c.raw = Json{{"num_experts_per_tok", 8}, {"moe_intermediate_size", 4096}};
  EXPECT_GT(activation_reserve_bytes(c, 2048, 2), r2048);
}

}  // namespace
