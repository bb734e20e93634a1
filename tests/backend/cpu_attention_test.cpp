// CPU paged attention and kv_write against a plain double-precision reference: several sequences
// of different lengths in one ragged batch (first token, full prefill, prefill chunk, decode),
// shuffled block tables over a NaN-poisoned cache, GQA ratios 1/2/4, head_dim 8/16/64/128,
// sliding window and softcap on/off, the rotating cache's sink keys before a window (the blocks no
// token sees then point at never-written NaN blocks), at every SIMD level this machine supports.
// Quantized caches (8 and 4 bits): the same reference over values dequantized here from the cache's
// own codes, scales and biases (a generic bit-stream reader, not the kernel's), and a loose bound
// against the float cache's output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu_test_util.h"
#include "kiln/backend/kv_quant.h"

namespace kiln::backend::cpu {
namespace {

using test::Rng;

class CpuAttention : public test::LevelTest {};

struct Seq {
  int64_t len;       // tokens in the cache once this step's K/V are written
  int64_t n_query;   // this step's tokens: positions [len - n_query, len)
};

// Row r of the values a quantized cache holds at slots[r]: codes read as the LSB-first bit stream of
// u32 words, times the f16 scale plus the f16 bias of their group.
std::vector<float> dequantized_rows(const KvTensor& c, const Tensor& slots, int64_t width) {
  const int bits = c.quant.bits, g = c.quant.group_size;
  const int64_t words = width * bits / 32, groups = width / g;
  std::vector<float> out(slots.numel() * width);
  for (int64_t r = 0; r < slots.numel(); ++r) {
    const int64_t s = slots.ptr<int32_t>()[r];
    for (int64_t i = 0; i < width; ++i) {
      const uint64_t bit = static_cast<uint64_t>(i) * bits;
      const uint32_t code = (c.data.ptr<uint32_t>()[s * words + bit / 32] >> (bit % 32)) & ((1u << bits) - 1);
      out[r * width + i] = static_cast<float>(code) * f16_to_f32(c.scales.ptr<uint16_t>()[s * groups + i / g]) +
                           f16_to_f32(c.biases.ptr<uint16_t>()[s * groups + i / g]);
    }
  }
  return out;
}

// A cache for n_blocks of block_size rows of width under quant, every byte 0xFF (f32/f16 NaN), so
// reading a row that was not written poisons the output.
KvTensor poisoned_cache(Backend& be, const KvQuant& quant, int64_t n_blocks, int64_t block_size, int64_t width) {
  KvTensor c = make_kv_tensor([&](DType t, Shape s) { return be.alloc(t, std::move(s)); }, quant, n_blocks, block_size,
                              width, DType::f32);
  for (Tensor* t : {&c.data, &c.scales, &c.biases})
    if (!t->empty()) std::memset(t->data, 0xFF, t->nbytes());
  return c;
}

// Builds the cache for `seqs` through kv_write, runs attention for every sequence's query tokens
// and compares each output with a double-precision softmax over the visible keys (for a quantized
// cache, over the values its codes hold). A quantized cache also runs against a float cache of the
// same K/V: the largest |difference| of the outputs is returned (0 for a float cache).
double check_attention(Backend& backend, Rng& rng, const std::vector<Seq>& seqs, int n_kv_heads, int gqa, int head_dim,
                       int window, float softcap, int block_size, int sink = 0, const KvQuant& quant = {}) {
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
  KvTensor k_cache = poisoned_cache(*be, quant, n_blocks, block_size, kv_width);
  KvTensor v_cache = poisoned_cache(*be, quant, n_blocks, block_size, kv_width);

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

  std::vector<float> k_ref, v_ref;  // what the cache holds, row by row of k_all / v_all
  if (quant.on()) {
    k_ref = dequantized_rows(k_cache, slots, kv_width);
    v_ref = dequantized_rows(v_cache, slots, kv_width);
  }
  const float* K = quant.on() ? k_ref.data() : k_all.ptr<float>();
  const float* V = quant.on() ? v_ref.data() : v_all.ptr<float>();
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
        EXPECT_NEAR(out.ptr<float>()[t * q_width + h * head_dim + i], ref, 1e-5)
            << "token " << t << " head " << h << " dim " << i;
        if (::testing::Test::HasFailure()) return 0;
      }
    }
  if (!quant.on()) return 0;
  KvTensor kf = poisoned_cache(*be, {}, n_blocks, block_size, kv_width), vf = poisoned_cache(*be, {}, n_blocks, block_size, kv_width);
  be->kv_write(k_all, v_all, slots, kf, vf);
  Tensor out_f = be->alloc(DType::f32, {n, q_width});
  be->attention(q, kf, vf, tables, token_seq, token_pos, p, out_f);
  double worst = 0;
  for (int64_t i = 0; i < out.numel(); ++i) worst = std::max(worst, double(std::fabs(out.ptr<float>()[i] - out_f.ptr<float>()[i])));
  return worst;
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

// Quantized caches: exact (to f32 rounding) against the values the codes hold, on every path of
// the driver (ragged prefill + decode, GQA groups, window, sink keys, softcap, head_dim 8 with one
// group per head row); against the float cache of the same K/V within a bound of the quantization step:
// |k|, |v| <= 1 give steps of 2/255 (8-bit) and 2/15 (4-bit), so a value is off by at most half a
// step plus the f16 rounding of scale and bias; the output (a convex combination of values, under
// weights that move with the keys' errors) is asserted within 2 steps.
TEST_P(CpuAttention, QuantizedCacheMatchesItsCodesAndNearsFloat) {
  Rng rng("CpuAttention.Quantized");
  auto be = backend();
  const std::vector<Seq> seqs = {{1, 1}, {70, 1}, {7, 7}, {33, 5}};
  for (int bits : {8, 4})
    for (int gqa : {1, 4})
      for (int head_dim : {8, 64, 128})
        for (int window : {0, 24})
          for (float softcap : {0.0f, 1.5f}) {
            const KvQuant q = resolve_kv_quant(bits, head_dim == 128 ? 32 : 64, head_dim);
            SCOPED_TRACE(fmt::format("bits={} group={} gqa={} head_dim={} window={} softcap={}", bits, q.group_size, gqa,
                                     head_dim, window, softcap));
            // (with a window, the rotating cache's 4 sink keys too)
            for (int sink : {0, window > 0 ? 4 : 0}) {
              const double d = check_attention(*be, rng, seqs, 2, gqa, head_dim, window, softcap, 16, sink, q);
              if (HasFailure()) return;
              EXPECT_LT(d, 2 * 2.0 / ((1 << bits) - 1));
            }
          }
}

TEST_P(CpuAttention, QuantizedKvWriteSkipsPaddingAndChecksLayout) {
  Rng rng("CpuAttention.QuantizedKvWrite");
  auto be = backend();
  const int64_t width = 64, n_blocks = 2, block_size = 4;
  const KvQuant q{4, 32};
  KvTensor kc = poisoned_cache(*be, q, n_blocks, block_size, width), vc = poisoned_cache(*be, q, n_blocks, block_size, width);
  Tensor k = rng.tensor(DType::f32, {2, width}), v = rng.tensor(DType::f32, {2, width});
  Tensor slots = test::host_ints({6, -1});
  be->kv_write(k, v, slots, kc, vc);
  // Row 6 holds k[0] quantized (the reference row quantizer); every other row keeps its poison.
  std::vector<uint32_t> codes(width * 4 / 32);
  std::vector<uint16_t> sc(2), bi(2);
  quantize_kv_row(k.ptr<float>(), width, q, codes.data(), sc.data(), bi.data());
  for (int64_t w = 0; w < 8; ++w) EXPECT_EQ(kc.data.ptr<uint32_t>()[6 * 8 + w], codes[w]);
  for (int64_t g = 0; g < 2; ++g) {
    EXPECT_EQ(kc.scales.ptr<uint16_t>()[6 * 2 + g], sc[g]);
    EXPECT_EQ(kc.biases.ptr<uint16_t>()[6 * 2 + g], bi[g]);
  }
  for (int64_t r = 0; r < n_blocks * block_size; ++r)
    if (r != 6) {
      EXPECT_EQ(kc.scales.ptr<uint16_t>()[r * 2], 0xFFFF) << r;
    }
  slots.ptr<int32_t>()[0] = 8;  // past the cache
  EXPECT_THROW(be->kv_write(k, v, slots, kc, vc), Error);
  slots.ptr<int32_t>()[0] = 1;
  KvTensor wrong = vc;
  wrong.quant = {8, 32};  // planes of a 4-bit layout under 8-bit params
  EXPECT_THROW(be->kv_write(k, v, slots, kc, wrong), Error);
  KvTensor narrow = poisoned_cache(*be, q, n_blocks, block_size, 32);
  EXPECT_THROW(be->kv_write(k, v, slots, narrow, narrow), Error);
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
