// Paged attention on the CPU over a ragged batch (semantics in backend.h): work items are (token,
// GQA group) pairs spread over the pool. Each item walks its visible keys in chunks with an online
// softmax per head (running max m, running sum l, unnormalized accumulator acc [head_dim]), so the
// score row is never materialized; K/V rows are found through the sequence's block table. A token's
// visible keys are walked as one run of "virtual" indices v: the sink keys [0, s) then the window
// [lo, pos] (VisibleKeys). A quantized cache's rows are dequantized one at a time as the walk
// reaches them (Rows).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/backend/checks.h"
#include "kiln/backend/kv_quant.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln::backend::cpu {

namespace {
constexpr int64_t kKeyChunk = 64;  // keys scored before one rescale of the accumulator
// One kv head's row of a cached key is head_dim floats every n_kv_heads * head_dim floats, and
// blocks are scattered: the hardware prefetchers do not follow that stride, so each row would be a
// full-latency miss. Rows kPrefetchKeys ahead are requested explicitly (prefetches never fault).
constexpr int64_t kPrefetchKeys = 6;
inline void prefetch_bytes(const void* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 64) __builtin_prefetch(static_cast<const char*>(p) + i);
}
// The keys token position `pos` sees (backend.h): [0, n_sink) then [lo, pos]; n_sink is 0 where the
// window reaches the sink (then [lo, pos] = [0, pos] holds it already).
struct VisibleKeys {
  int64_t lo, hi, n_sink;
  VisibleKeys(const AttnParams& p, int64_t pos)
      : lo(p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0),
        hi(pos),
        n_sink(p.window > 0 ? std::min<int64_t>(std::max(p.sink, 0), lo) : 0) {}
  int64_t count() const { return n_sink + hi + 1 - lo; }
  int64_t key(int64_t v) const { return v < n_sink ? v : v - n_sink + lo; }  // v in [0, count())
};

// One kv head's rows of a cache as f32: a float cache's row in place; a quantized one's row
// dequantized into the caller's hd floats (on the fly, once per row and GQA group).
struct Rows {
  const float* f = nullptr;  // float cache
  const uint32_t* codes = nullptr;
  const uint16_t *scales = nullptr, *biases = nullptr;
  KvQuant quant;
  int64_t hd = 0, stride = 0, head = 0;          // per row / per kv head: floats or code words
  int64_t g_stride = 0, g_head = 0;             // per row / per kv head: groups
  Rows(const KvTensor& c, int64_t kv_width, int64_t head_dim) : quant(c.quant), hd(head_dim) {
    if (!c.quantized()) {
      f = c.data.ptr<float>();
      stride = kv_width;
      head = hd;
      return;
    }
    codes = c.data.ptr<uint32_t>();
    scales = c.scales.ptr<uint16_t>();
    biases = c.biases.ptr<uint16_t>();
    stride = kv_width * quant.bits / 32;
    head = hd * quant.bits / 32;
    g_stride = kv_width / quant.group_size;
    g_head = hd / quant.group_size;
  }
  const float* get(int64_t slot, int64_t kvh, float* buf) const {
    if (f) return f + slot * stride + kvh * head;
    const int64_t g = slot * g_stride + kvh * g_head;
    dequantize_kv_row(codes + slot * stride + kvh * head, scales + g, biases + g, hd, quant, buf);
    return buf;
  }
  void prefetch(int64_t slot, int64_t kvh) const {
    if (f) return prefetch_bytes(f + slot * stride + kvh * head, hd * 4);
    prefetch_bytes(codes + slot * stride + kvh * head, hd * quant.bits / 8);
    __builtin_prefetch(scales + slot * g_stride + kvh * g_head);
    __builtin_prefetch(biases + slot * g_stride + kvh * g_head);
  }
};
}  // namespace

void attention(const Kernels& k, ThreadPool& pool, const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache,
               const Tensor& block_tables, const Tensor& token_seq, const Tensor& token_pos, const AttnParams& p,
               Tensor& out) {
  for (const Tensor* t : {&q, static_cast<const Tensor*>(&out)})
    if (t->dtype != DType::f32) fail("cpu", "attention: q and out must be float32, got {}", dtype_name(t->dtype));
  for (const KvTensor* t : {&k_cache, &v_cache})
    if (!t->quantized() && t->data.dtype != DType::f32)
      fail("cpu", "attention: float caches must be float32, got {}", dtype_name(t->data.dtype));
  for (const Tensor* t : {&block_tables, &token_seq, &token_pos})
    if (t->dtype != DType::i32) fail("cpu", "attention: block tables, token_seq and token_pos must be int32");
  checks::attention("cpu", q, k_cache, v_cache, block_tables, token_seq, token_pos, p, out);
  const int64_t n = token_seq.numel(), hd = p.head_dim, q_width = int64_t{p.n_heads} * hd,
                kv_width = int64_t{p.n_kv_heads} * hd;
  const int64_t n_blocks = k_cache.n_rows() / p.block_size;
  const int64_t n_seqs = block_tables.numel() / p.max_blocks;
  const int32_t* seq = token_seq.ptr<int32_t>();
  const int32_t* pos = token_pos.ptr<int32_t>();
  const int32_t* bt = block_tables.ptr<int32_t>();
  // Validate every index the kernel will follow, so bad batches fail here instead of reading wild.
  int64_t total_keys = 0;  // sum over tokens of visible keys: the work estimate
  for (int64_t t = 0; t < n; ++t) {
    if (seq[t] < 0 || seq[t] >= n_seqs) fail("cpu", "attention: token {} has sequence {} of {}", t, seq[t], n_seqs);
    if (pos[t] < 0 || pos[t] / p.block_size >= p.max_blocks)
      fail("cpu", "attention: token {} position {} outside {} blocks of {}", t, pos[t], p.max_blocks, p.block_size);
    const VisibleKeys vk(p, pos[t]);
    total_keys += vk.count();
    for (int64_t b = 0; b <= pos[t] / p.block_size; ++b) {
      if (b * p.block_size >= vk.n_sink && (b + 1) * p.block_size <= vk.lo) continue;  // not read
      int32_t blk = bt[seq[t] * int64_t{p.max_blocks} + b];
      if (blk < 0 || blk >= n_blocks)
        fail("cpu", "attention: sequence {} block {} maps to cache block {} of {}", seq[t], b, blk, n_blocks);
    }
  }

  // A work item is one token and a run of `per_item` query heads that share one kv head: the whole
  // GQA group when there are enough (token, kv head) pairs to keep the pool busy (each cached row
  // is then read once per group), else a single head (decode of a small model still spreads).
  const int64_t group = p.n_heads / p.n_kv_heads;
  const int64_t per_item = n * p.n_kv_heads >= 2 * int64_t{pool.n_threads()} ? group : 1;
  const int64_t items_per_token = p.n_heads / per_item;
  const Rows kc(k_cache, kv_width, hd), vc(v_cache, kv_width, hd);
  // Tiny batches (a few short rows of a small model) run on the caller: waking the pool costs more.
  const int64_t n_items = n * items_per_token;
  const bool tiny = total_keys * p.n_heads * hd < (int64_t{1} << 15);
  pool.parallel_for(n_items, [&](int64_t ib, int64_t ie) {
    // acc [per_item, hd] unnormalized outputs; scores [per_item, kKeyChunk]; m, l [per_item]
    // kbuf, vbuf [hd]: a quantized row dequantized
    std::vector<float> acc(per_item * hd), scores(per_item * kKeyChunk), m(per_item), l(per_item), e(per_item),
        kbuf(hd), vbuf(hd);
    for (int64_t item = ib; item < ie; ++item) {
      const int64_t t = item / items_per_token, h0 = (item % items_per_token) * per_item, kvh = h0 / group;
      const float* qv = q.ptr<float>() + t * q_width + h0 * hd;  // per_item heads, stride hd
      const int32_t* table = bt + seq[t] * int64_t{p.max_blocks};
      const VisibleKeys vk(p, pos[t]);
      const int64_t nv = vk.count();
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      // the cache row (slot) of visible key v (and its value)
      auto row = [&](int64_t v) {
        const int64_t j = vk.key(v);
        return table[j / p.block_size] * int64_t{p.block_size} + j % p.block_size;
      };
      for (int64_t j0 = 0; j0 < nv; j0 += kKeyChunk) {
        const int64_t cn = std::min(kKeyChunk, nv - j0);
        for (int64_t c = 0; c < cn; ++c) {
          if (j0 + c + kPrefetchKeys < nv) {  // this key's row soon; its value row for the pass below
            kc.prefetch(row(j0 + c + kPrefetchKeys), kvh);
            vc.prefetch(row(j0 + c + kPrefetchKeys), kvh);
          }
          k.dot_multi(qv, per_item, hd, kc.get(row(j0 + c), kvh, kbuf.data()), hd, e.data());
          for (int64_t g = 0; g < per_item; ++g) {
            float s = e[g] * p.scale;
            if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
            scores[g * kKeyChunk + c] = s;
          }
        }
        for (int64_t g = 0; g < per_item; ++g) {
          float cmax = -std::numeric_limits<float>::infinity();
          for (int64_t c = 0; c < cn; ++c) cmax = std::max(cmax, scores[g * kKeyChunk + c]);
          if (cmax > m[g]) {  // rescale what was accumulated under the old max
            const float f = std::exp(m[g] - cmax);  // 0 on the first chunk (m = -inf)
            k.scale(acc.data() + g * hd, f, hd);
            l[g] *= f;
            m[g] = cmax;
          }
          for (int64_t c = 0; c < cn; ++c) {
            float& sc = scores[g * kKeyChunk + c];
            sc = std::exp(sc - m[g]);  // the weight of key j0 + c
            l[g] += sc;
          }
        }
        for (int64_t c = 0; c < cn; ++c) {
          if (c + kPrefetchKeys < cn) vc.prefetch(row(j0 + c + kPrefetchKeys), kvh);
          for (int64_t g = 0; g < per_item; ++g) e[g] = scores[g * kKeyChunk + c];
          k.axpy_multi(e.data(), per_item, vc.get(row(j0 + c), kvh, vbuf.data()), acc.data(), hd, hd);
        }
      }
      for (int64_t g = 0; g < per_item; ++g) {
        float* o = out.ptr<float>() + t * q_width + (h0 + g) * hd;
        const float inv = l[g] > 0 ? 1.0f / l[g] : 0.0f;
        for (int64_t d = 0; d < hd; ++d) o[d] = acc[g * hd + d] * inv;
      }
    }
  }, tiny ? n_items : 1);
}

}  // namespace kiln::backend::cpu
