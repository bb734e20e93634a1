// cuda_attn_bench: the CUDA prefill attention kernel alone on llama-3-8b's heads (32 query heads,
// 8 kv heads, head_dim 128, cache blocks of 16 rows, random bf16 data): whole causal prompts of
// 512 / 2048 / 8192 tokens in one sequence, and 4 prompts of 2048 in one ragged batch. Reports the
// median time of 10 timed batches after warm-up and the rate in causal FLOPs (4 * head_dim *
// n_heads * visible keys summed over tokens). Then decode (one query token per sequence) at 4k and
// 32k contexts, batch 1 and 8, with the bf16 cache and quantized ones (--kv-bits 8 and 4, groups of
// 64): the attention op's median time and the cache bytes it reads per step. One JSON line per
// case; exits 1 without a device.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_util.h"
#include "kiln/backend/backend.h"
#include "kiln/backend/kv_quant.h"

using namespace kiln;
using bench::median_seconds;
using bench::random_bf16;

namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;

Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::host(DType::i32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

// n_seqs prompts of `len` tokens each, all queried (a whole prefill step); blocks laid out in order.
void run_case(backend::Backend& be, int n_seqs, int len) {
  const int blocks_per_seq = (len + kBlock - 1) / kBlock, n = n_seqs * len;
  const int64_t kv_width = int64_t{kKvHeads} * kHeadDim, q_width = int64_t{kHeads} * kHeadDim;
  std::vector<int32_t> tables, seq, pos;
  for (int s = 0; s < n_seqs; ++s) {
    for (int b = 0; b < blocks_per_seq; ++b) tables.push_back(s * blocks_per_seq + b);
    for (int j = 0; j < len; ++j) seq.push_back(s), pos.push_back(j);
  }
  const int64_t n_blocks = int64_t{n_seqs} * blocks_per_seq;
  Tensor kc = be.upload(random_bf16({n_blocks, kBlock, kv_width}, 1)),
         vc = be.upload(random_bf16({n_blocks, kBlock, kv_width}, 2)), q = be.upload(random_bf16({n, q_width}, 3));
  Tensor bt = be.upload(host_i32(tables)), ts = be.upload(host_i32(seq)), tp = be.upload(host_i32(pos));
  Tensor out = be.alloc(DType::bf16, {n, q_width});
  backend::AttnParams p;
  p.n_heads = kHeads, p.n_kv_heads = kKvHeads, p.head_dim = kHeadDim, p.block_size = kBlock;
  p.max_blocks = blocks_per_seq, p.scale = 0.08838834764831845f;
  const auto f = [&] { be.attention(q, kc, vc, bt, ts, tp, p, out); };
  const double t = median_seconds(be, f, std::max(1, (1 << 24) / (len * len) * 4));
  const double keys = double(n_seqs) * len * (len + 1.0) / 2.0;  // visible keys summed over tokens
  const double tflops = 4.0 * kHeadDim * kHeads * keys / t / 1e12;
  std::printf("{\"case\": \"prefill %dx%d\", \"heads\": \"%d/%d x %d\", \"ms\": %.3f, \"TFLOPs\": %.1f}\n", n_seqs,
              len, kHeads, kKvHeads, kHeadDim, t * 1e3, tflops);
  std::fflush(stdout);
}

// Decode: n_seqs sequences of `len` cached tokens, one query token each, cache of `bits` (0: bf16).
void run_decode(backend::Backend& be, int n_seqs, int len, int bits) {
  const int blocks_per_seq = (len + kBlock - 1) / kBlock;
  const int64_t kv_width = int64_t{kKvHeads} * kHeadDim, q_width = int64_t{kHeads} * kHeadDim;
  const int64_t n_blocks = int64_t{n_seqs} * blocks_per_seq;
  std::vector<int32_t> tables, seq, pos;
  for (int s = 0; s < n_seqs; ++s) {
    for (int b = 0; b < blocks_per_seq; ++b) tables.push_back(s * blocks_per_seq + b);
    seq.push_back(s), pos.push_back(len - 1);
  }
  const backend::KvQuant qz = bits ? backend::KvQuant{bits, 64} : backend::KvQuant{};
  // A quantized cache's planes: random codes, scales ~ 1/64, biases ~ -1 (values of magnitude ~1).
  auto cache = [&](uint64_t seed) {
    if (!bits) return backend::KvTensor(be.upload(random_bf16({n_blocks, kBlock, kv_width}, seed)));
    backend::KvTensor t = backend::make_kv_tensor([](DType d, Shape s) { return Tensor::host(d, std::move(s)); }, qz,
                                                  n_blocks, kBlock, kv_width, DType::bf16);
    uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 1;
    for (int64_t i = 0; i < t.data.numel(); ++i) t.data.ptr<uint32_t>()[i] = x = x * 1664525u + 1013904223u;
    for (int64_t i = 0; i < t.scales.numel(); ++i)
      t.scales.ptr<uint16_t>()[i] = f32_to_f16(1.0f / 64), t.biases.ptr<uint16_t>()[i] = f32_to_f16(-1.0f);
    t.data = be.upload(t.data), t.scales = be.upload(t.scales), t.biases = be.upload(t.biases);
    return t;
  };
  const backend::KvTensor kc = cache(1), vc = cache(2);
  Tensor q = be.upload(random_bf16({n_seqs, q_width}, 3));
  Tensor bt = be.upload(host_i32(tables)), ts = be.upload(host_i32(seq)), tp = be.upload(host_i32(pos));
  Tensor out = be.alloc(DType::bf16, {n_seqs, q_width});
  backend::AttnParams p;
  p.n_heads = kHeads, p.n_kv_heads = kKvHeads, p.head_dim = kHeadDim, p.block_size = kBlock;
  p.max_blocks = blocks_per_seq, p.scale = 0.08838834764831845f;
  const auto f = [&] {  // in a step: the split-K partials come from the step arena, as in a decode step
    backend::StepScope step(be);
    be.attention(q, kc, vc, bt, ts, tp, p, out);
  };
  const double t = median_seconds(be, f, 20);
  const double bytes = 2.0 * n_seqs * len * backend::kv_row_bytes(qz, kv_width, 2);
  std::printf("{\"case\": \"decode %dx%d\", \"kv_bits\": %d, \"heads\": \"%d/%d x %d\", \"us\": %.1f, "
              "\"cache_MB\": %.1f, \"GBps\": %.0f}\n",
              n_seqs, len, bits, kHeads, kKvHeads, kHeadDim, t * 1e6, bytes / 1e6, bytes / t / 1e9);
  std::fflush(stdout);
}

}  // namespace

int main() {
  if (!backend::cuda_device_available()) {
    std::fprintf(stderr, "cuda_attn_bench: no CUDA device\n");
    return 1;
  }
  try {
    auto be = backend::make_cuda_backend(0);
    run_case(*be, 1, 512);
    run_case(*be, 1, 2048);
    run_case(*be, 1, 8192);
    run_case(*be, 4, 2048);
    for (int len : {4096, 32768})
      for (int n_seqs : {1, 8})
        for (int bits : {0, 8, 4}) run_decode(*be, n_seqs, len, bits);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_attn_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
