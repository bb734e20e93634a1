// Paged attention on the CPU over a ragged batch (semantics in backend.h): one work item per
// (token, head) pair, spread over the pool. Each item walks its visible keys in chunks with an
// online softmax (running max m, running sum l, unnormalized accumulator acc [head_dim]), so the
// score row is never materialized; K/V rows are found through the sequence's block table.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln::backend::cpu {

namespace {
constexpr int64_t kKeyChunk = 64;  // keys scored before one rescale of the accumulator
}

void attention(const Kernels& k, ThreadPool& pool, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
               const Tensor& block_tables, const Tensor& token_seq, const Tensor& token_pos, const AttnParams& p,
               Tensor& out) {
  for (const Tensor* t : {&q, &k_cache, &v_cache, static_cast<const Tensor*>(&out)})
    if (t->dtype != DType::f32) fail("cpu", "attention: q, caches and out must be float32, got {}", dtype_name(t->dtype));
  for (const Tensor* t : {&block_tables, &token_seq, &token_pos})
    if (t->dtype != DType::i32) fail("cpu", "attention: block tables, token_seq and token_pos must be int32");
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.head_dim <= 0 || p.n_heads % p.n_kv_heads != 0 ||
      p.block_size <= 0 || p.max_blocks <= 0)
    fail("cpu", "attention: bad params n_heads={} n_kv_heads={} head_dim={} block_size={} max_blocks={}", p.n_heads,
         p.n_kv_heads, p.head_dim, p.block_size, p.max_blocks);
  const int64_t n = token_seq.numel(), hd = p.head_dim, q_width = int64_t{p.n_heads} * hd,
                kv_width = int64_t{p.n_kv_heads} * hd;
  if (token_pos.numel() != n || q.numel() != n * q_width || out.numel() != n * q_width)
    fail("cpu", "attention: q {} out {} for {} tokens of {} heads x {}", shape_str(q.shape), shape_str(out.shape), n,
         p.n_heads, hd);
  const int64_t block_elems = int64_t{p.block_size} * kv_width;
  if (k_cache.numel() != v_cache.numel() || k_cache.numel() % block_elems != 0)
    fail("cpu", "attention: caches {} / {} are not [n_blocks, {}, {}]", shape_str(k_cache.shape),
         shape_str(v_cache.shape), p.block_size, kv_width);
  const int64_t n_blocks = k_cache.numel() / block_elems;
  if (block_tables.numel() % p.max_blocks != 0)
    fail("cpu", "attention: block_tables of {} entries is not n_seqs x {}", block_tables.numel(), p.max_blocks);
  const int64_t n_seqs = block_tables.numel() / p.max_blocks;
  const int32_t* seq = token_seq.ptr<int32_t>();
  const int32_t* pos = token_pos.ptr<int32_t>();
  const int32_t* bt = block_tables.ptr<int32_t>();
  // Validate every index the kernel will follow, so bad batches fail here instead of reading wild.
  for (int64_t t = 0; t < n; ++t) {
    if (seq[t] < 0 || seq[t] >= n_seqs) fail("cpu", "attention: token {} has sequence {} of {}", t, seq[t], n_seqs);
    if (pos[t] < 0 || pos[t] / p.block_size >= p.max_blocks)
      fail("cpu", "attention: token {} position {} outside {} blocks of {}", t, pos[t], p.max_blocks, p.block_size);
    const int64_t lo = p.window > 0 ? std::max<int64_t>(0, pos[t] - p.window + 1) : 0;
    for (int64_t b = lo / p.block_size; b <= pos[t] / p.block_size; ++b) {
      int32_t blk = bt[seq[t] * int64_t{p.max_blocks} + b];
      if (blk < 0 || blk >= n_blocks)
        fail("cpu", "attention: sequence {} block {} maps to cache block {} of {}", seq[t], b, blk, n_blocks);
    }
  }

  const int64_t group = p.n_heads / p.n_kv_heads;
  const float* kc = k_cache.ptr<float>();
  const float* vc = v_cache.ptr<float>();
  pool.parallel_for(n * p.n_heads, [&](int64_t ib, int64_t ie) {
    std::vector<float> acc(hd), scores(kKeyChunk);
    for (int64_t item = ib; item < ie; ++item) {
      const int64_t t = item / p.n_heads, h = item % p.n_heads, kvh = h / group;
      const float* qv = q.ptr<float>() + t * q_width + h * hd;
      const int32_t* table = bt + seq[t] * int64_t{p.max_blocks};
      const int64_t hi = pos[t], lo = p.window > 0 ? std::max<int64_t>(0, hi - p.window + 1) : 0;
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      // offset of key j (and value j) of this kv head in the caches
      auto row = [&](int64_t j) { return (table[j / p.block_size] * int64_t{p.block_size} + j % p.block_size) * kv_width + kvh * hd; };
      for (int64_t j0 = lo; j0 <= hi; j0 += kKeyChunk) {
        const int64_t cn = std::min(kKeyChunk, hi + 1 - j0);
        float cmax = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < cn; ++c) {
          float s = k.dot(qv, kc + row(j0 + c), hd) * p.scale;
          if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
          scores[c] = s;
          cmax = std::max(cmax, s);
        }
        if (cmax > m) {  // rescale what was accumulated under the old max
          const float f = std::exp(m - cmax);  // 0 on the first chunk (m = -inf)
          k.scale(acc.data(), f, hd);
          l *= f;
          m = cmax;
        }
        for (int64_t c = 0; c < cn; ++c) {
          const float e = std::exp(scores[c] - m);
          l += e;
          k.axpy(e, vc + row(j0 + c), acc.data(), hd);
        }
      }
      float* o = out.ptr<float>() + t * q_width + h * hd;
      const float inv = l > 0 ? 1.0f / l : 0.0f;
      for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
    }
  });
}

}  // namespace kiln::backend::cpu
