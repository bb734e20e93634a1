// CPU paged attention and kv_write against a plain double-precision reference: several sequences
// of different lengths in one ragged batch (first token, full prefill, prefill chunk, decode),
// shuffled block tables over a NaN-poisoned cache, GQA ratios 1/2/4, head_dim 8/16/64/128,
// sliding window and softcap on/off, the rotating cache's sink keys before a window (the blocks no
// token sees then point at never-written NaN blocks), at every SIMD level this machine supports.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu_test_util.h"

namespace kiln::backend::cpu {
namespace {

using test::Rng;

class CpuAttention : public test::LevelTest {};

struct Seq {
  int64_t len;       // tokens in the cache once this step's K/V are written
  int64_t n_query;   // this step's tokens: positions [len - n_query, len)
};

// Builds the cache for `seqs` through kv_write, runs attention for every sequence's query tokens
// and compares each output with a double-precision softmax over the visible keys.
void check_attention(Backend& backend, Rng& rng, const std::vector<Seq>& seqs, int n_kv_heads, int gqa, int head_dim,
                     int window, float softcap, int block_size, int sink = 0) {
  Backend* be = &backend;
  AttnParams p;
  p.n_kv_heads = n_kv_heads;
  p.n_heads = p.n_kv_heads * gqa;
  p.head_dim = head_dim;
  p.scale = 1.3f / std::sqrt(float(head_dim));
  p.softcap = softcap;
  p.window = window;
  p.sink = sink;
  p.block_size = block_size;
  const int64_t kv_width = int64_t{p.n_kv_heads} * head_dim, q_width = int64_t{p.n_heads} * head_dim;

  // Block tables: a random permutation of the cache's blocks (plus spare blocks nobody owns),
  // unused entries -1.
  int64_t need = 0, max_blocks = 0;
  for (const Seq& s : seqs) {
    need += (s.len + block_size - 1) / block_size;
    max_blocks = std::max(max_blocks, (s.len + block_size - 1) / block_size);
  }
  p.max_blocks = static_cast<int>(max_blocks + 1);
  const int64_t n_blocks = need + 3;
  std::vector<int32_t> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen());
  Tensor tables = Tensor::host(DType::i32, {int64_t(seqs.size()) * p.max_blocks});
  std::fill(tables.ptr<int32_t>(), tables.ptr<int32_t>() + tables.numel(), -1);
  int64_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t b = 0; b < (seqs[s].len + block_size - 1) / block_size; ++b)
      tables.ptr<int32_t>()[s * p.max_blocks + b] = perm[next++];

  // The cache starts as NaN: reading any row that was not written poisons the output.
  Tensor k_cache = be->alloc(DType::f32, {n_blocks, block_size, kv_width});
  Tensor v_cache = be->alloc(DType::f32, {n_blocks, block_size, kv_width});
  test::fill_nan(k_cache);
  test::fill_nan(v_cache);

  // Every sequence's K/V for positions [0, len), written in one kv_write call.
  int64_t total = 0;
  for (const Seq& s : seqs) total += s.len;
  Tensor k_all = rng.tensor(DType::f32, {total, kv_width}), v_all = rng.tensor(DType::f32, {total, kv_width});
  Tensor slots = Tensor::host(DType::i32, {total});
  std::vector<int64_t> base(seqs.size());  // row of (seq s, pos 0) in k_all
  for (int64_t s = 0, r = 0; s < int64_t(seqs.size()); ++s) {
    base[s] = r;
    for (int64_t j = 0; j < seqs[s].len; ++j, ++r)
      slots.ptr<int32_t>()[r] = tables.ptr<int32_t>()[s * p.max_blocks + j / block_size] * block_size +
                                j % block_size;
  }
  be->kv_write(k_all, v_all, slots, k_cache, v_cache);

  // The keys position pos sees: [0, min(sink, lo)) then [lo, pos].
  auto visible = [&](int64_t pos) {
    const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
    std::vector<int64_t> keys;
    for (int64_t j = 0; j < std::min<int64_t>(window > 0 ? sink : 0, lo); ++j) keys.push_back(j);
    for (int64_t j = lo; j <= pos; ++j) keys.push_back(j);
    return keys;
  };
  // With a sink: the blocks none of a sequence's query tokens sees now point at a spare block (never
  // written: NaN), as the engine's given-back blocks may point anywhere.
  if (sink > 0)
    for (size_t s = 0; s < seqs.size(); ++s) {
      std::vector<bool> seen((seqs[s].len + block_size - 1) / block_size, false);
      for (int64_t j = seqs[s].len - seqs[s].n_query; j < seqs[s].len; ++j)
        for (int64_t key : visible(j)) seen[key / block_size] = true;
      for (size_t b = 0; b < seen.size(); ++b)
        if (!seen[b]) tables.ptr<int32_t>()[s * p.max_blocks + b] = perm[n_blocks - 1];
    }

  // The ragged batch: each sequence's query tokens.
  std::vector<int32_t> tseq, tpos;
  for (int64_t s = 0; s < int64_t(seqs.size()); ++s)
    for (int64_t j = seqs[s].len - seqs[s].n_query; j < seqs[s].len; ++j) {
      tseq.push_back(static_cast<int32_t>(s));
      tpos.push_back(static_cast<int32_t>(j));
    }
  const int64_t n = int64_t(tseq.size());
  Tensor token_seq = Tensor::host(DType::i32, {n}), token_pos = Tensor::host(DType::i32, {n});
  std::copy(tseq.begin(), tseq.end(), token_seq.ptr<int32_t>());
  std::copy(tpos.begin(), tpos.end(), token_pos.ptr<int32_t>());
  Tensor q = rng.tensor(DType::f32, {n, q_width}, 2.0f);
  Tensor out = be->alloc(DType::f32, {n, q_width});
  test::fill_nan(out);
  be->attention(q, k_cache, v_cache, tables, token_seq, token_pos, p, out);

  const float* K = k_all.ptr<float>();
  const float* V = v_all.ptr<float>();
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < p.n_heads; ++h) {
      const int kvh = h / gqa;
      const std::vector<int64_t> keys = visible(tpos[t]);
      const float* qv = q.ptr<float>() + t * q_width + h * head_dim;
      std::vector<double> sc;
      double mx = -1e300;
      for (int64_t j : keys) {
        const float* kv = K + (base[tseq[t]] + j) * kv_width + kvh * head_dim;
        double d = 0;
        for (int i = 0; i < head_dim; ++i) d += double(qv[i]) * kv[i];
        d *= p.scale;
        if (softcap > 0) d = softcap * std::tanh(d / softcap);
        sc.push_back(d);
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (double& d : sc) sum += (d = std::exp(d - mx));
      for (int i = 0; i < head_dim; ++i) {
        double ref = 0;
        for (size_t c = 0; c < keys.size(); ++c)
          ref += sc[c] / sum * V[(base[tseq[t]] + keys[c]) * kv_width + kvh * head_dim + i];
        // a convex combination of |v| <= 1 values: 1e-5 absolute is ~100 f32 ulps of the scale
        ASSERT_NEAR(out.ptr<float>()[t * q_width + h * head_dim + i], ref, 1e-5)
            << "token " << t << " head " << h << " dim " << i;
      }
    }
}

TEST_P(CpuAttention, PagedRaggedMatchesReference) {
  Rng rng("CpuAttention.PagedRagged");
  auto be = backend();
  // first token, decode at 70, full prefill, a prefill chunk, a short chunk: 17 tokens x 2 kv heads
  const std::vector<Seq> seqs = {{1, 1}, {70, 1}, {7, 7}, {33, 5}, {20, 3}};
  for (int gqa : {1, 2, 4})
    for (int head_dim : {8, 16, 64, 128})
      for (int window : {0, 5, 24})
        for (float softcap : {0.0f, 1.5f})
          for (int block_size : {4, 16}) {
            SCOPED_TRACE(fmt::format("gqa={} head_dim={} window={} softcap={} block_size={}", gqa, head_dim, window,
                                     softcap, block_size));
            check_attention(*be, rng, seqs, 2, gqa, head_dim, window, softcap, block_size);
            if (HasFatalFailure()) return;
          }
}

// The rotating cache (--max-kv-size): sink keys [0, sink) besides the window, for decodes deep past
// the window, prefill chunks whose rows' windows start in different blocks, and windows that still
// reach the sink (nothing extra); blocks no query token sees are NaN blocks.
TEST_P(CpuAttention, SinkAndWindowMatchReference) {
  Rng rng("CpuAttention.SinkWindow");
  auto be = backend();
  const std::vector<Seq> seqs = {{1, 1}, {70, 1}, {9, 9}, {90, 37}, {130, 2}, {12, 3}};
  for (int gqa : {1, 4})
    for (int head_dim : {16, 64})
      for (int window : {6, 20})
        for (int sink : {1, 4, 7})
          for (int block_size : {1, 4, 16}) {
            SCOPED_TRACE(fmt::format("gqa={} head_dim={} window={} sink={} block_size={}", gqa, head_dim, window, sink,
                                     block_size));
            check_attention(*be, rng, seqs, 2, gqa, head_dim, window, 0.0f, block_size, sink);
            if (HasFatalFailure()) return;
          }
}

// One decode token of a single-kv-head model: too few (token, kv head) pairs to fill the pool, so
// the heads of the group are spread one per work item (the other path of the driver).
TEST_P(CpuAttention, SingleTokenDecodeSpreadsHeads) {
  Rng rng("CpuAttention.SingleToken");
  auto be = backend();
  for (int gqa : {1, 4})
    for (int window : {0, 9}) {
      SCOPED_TRACE(fmt::format("gqa={} window={}", gqa, window));
      check_attention(*be, rng, {{45, 1}}, 1, gqa, 64, window, 0.0f, 16);
      if (HasFatalFailure()) return;
    }
}

TEST_P(CpuAttention, KvWriteStoresRowsAndSkipsPadding) {
  Rng rng("CpuAttention.KvWrite");
  auto be = backend();
  const int64_t width = 24, n_blocks = 3, block_size = 4;
  Tensor kc = be->alloc(DType::f32, {n_blocks, block_size, width}), vc = be->alloc(DType::f32, {n_blocks, block_size, width});
  Tensor k = rng.tensor(DType::f32, {3, width}), v = rng.tensor(DType::f32, {3, width});
  Tensor slots = Tensor::host(DType::i32, {3});
  const int32_t sl[3] = {11, -1, 5};
  std::copy(sl, sl + 3, slots.ptr<int32_t>());
  be->kv_write(k, v, slots, kc, vc);
  for (int64_t r = 0; r < n_blocks * block_size; ++r)
    for (int64_t i = 0; i < width; ++i) {
      float ek = 0, ev = 0;  // alloc zero-fills; untouched rows stay 0
      if (r == 11) ek = k.ptr<float>()[i], ev = v.ptr<float>()[i];
      if (r == 5) ek = k.ptr<float>()[2 * width + i], ev = v.ptr<float>()[2 * width + i];
      ASSERT_EQ(kc.ptr<float>()[r * width + i], ek) << r;
      ASSERT_EQ(vc.ptr<float>()[r * width + i], ev) << r;
    }
  slots.ptr<int32_t>()[0] = 12;
  EXPECT_THROW(be->kv_write(k, v, slots, kc, vc), Error);
}

TEST_P(CpuAttention, RejectsBlockOutsideCache) {
  auto be = backend();
  AttnParams p;
  p.n_heads = 2;
  p.n_kv_heads = 1;
  p.head_dim = 8;
  p.block_size = 4;
  p.max_blocks = 2;
  Tensor kc = be->alloc(DType::f32, {2, 4, 8}), vc = be->alloc(DType::f32, {2, 4, 8});
  Tensor tables = Tensor::host(DType::i32, {2});
  tables.ptr<int32_t>()[0] = 0;
  tables.ptr<int32_t>()[1] = 7;  // no such block
  Tensor seq = Tensor::host(DType::i32, {1}), pos = Tensor::host(DType::i32, {1});
  pos.ptr<int32_t>()[0] = 5;
  Tensor q = be->alloc(DType::f32, {1, 16}), out = be->alloc(DType::f32, {1, 16});
  EXPECT_THROW(be->attention(q, kc, vc, tables, seq, pos, p, out), Error);
  tables.ptr<int32_t>()[1] = 1;
  EXPECT_NO_THROW(be->attention(q, kc, vc, tables, seq, pos, p, out));
}

INSTANTIATE_TEST_SUITE_P(Levels, CpuAttention, ::testing::ValuesIn(test::available_levels()), test::level_name);

}  // namespace
}  // namespace kiln::backend::cpu
