// CPU backend micro-benchmarks: this machine's memory read bandwidth (a SIMD sum over a 1 GiB
// buffer on all pool threads, best of several) and the decode GEMV rate for a 4096x4096 bf16 weight
// (GB/s of weight streamed: hot = one weight re-read from cache, cold = cycling 1 GiB of weights so
// each call reads DRAM), plus prefill GEMM GFLOP/s and decode attention, at each SIMD level.
// Quantized decode GEMVs (3, 4, 6, 8 bits, group 64, bf16 scales; cold) report GB/s of packed weight.
// Usage: cpu_ops_bench [--quick | --bandwidth]   (--bandwidth: only the memory figure)   (KILN_THREADS sets the pool size).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/quant/affine.h"

using namespace kiln;
using namespace kiln::backend;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Best time of `reps` runs of fn.
template <class F>
double best_of(int reps, F&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

Tensor filled(DType t, Shape s, ThreadPool& pool) {
  Tensor r = Tensor::host(t, std::move(s));
  pool.parallel_for(r.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float v = static_cast<float>(static_cast<int>(i % 17) - 8) * 0.01f;
      if (t == DType::f32) r.ptr<float>()[i] = v;
      else if (t == DType::bf16) r.ptr<uint16_t>()[i] = f32_to_bf16(v);
      else r.ptr<uint16_t>()[i] = f32_to_f16(v);
    }
  });
  return r;
}

double memory_read_gbps(const cpu::Kernels& k, ThreadPool& pool, int reps) {
  const int64_t n = (int64_t{1} << 30) / sizeof(float);  // 1 GiB of f32
  Tensor buf = filled(DType::f32, {n}, pool);            // first touch on the pool threads
  std::mutex mu;
  double total = 0;
  double t = best_of(reps, [&] {
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      float s = k.sum_sq(buf.ptr<float>() + b, e - b);
      std::lock_guard<std::mutex> lock(mu);
      total += s;
    });
  });
  if (total == 12345.678) std::printf(" ");  // keep the sums observable
  return static_cast<double>(buf.nbytes()) / t / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string arg = argc > 1 ? argv[1] : "";
  const bool quick = arg == "--quick", bandwidth_only = arg == "--bandwidth";
  const int reps = quick ? 3 : 7;
  ThreadPool& pool = ThreadPool::global();
  std::printf("cpu_ops_bench: %d threads, best SIMD level %s%s\n", pool.n_threads(),
              cpu::simd_level_name(cpu::best_simd_level()), quick ? " (quick)" : "");

  const cpu::Kernels& best = cpu::kernels_for(cpu::best_simd_level());
  const double mem = memory_read_gbps(best, pool, reps);
  std::printf("memory read bandwidth (1 GiB sum, all threads): %.1f GB/s\n", mem);
  if (bandwidth_only) return 0;

  const int64_t dim = 4096;
  std::vector<cpu::SimdLevel> levels;
  for (auto l : {cpu::SimdLevel::scalar, cpu::SimdLevel::avx2, cpu::SimdLevel::avx512, cpu::SimdLevel::avx512vnni})
    if (static_cast<int>(l) <= static_cast<int>(cpu::best_simd_level())) levels.push_back(l);

  // Cold weights: enough distinct 4096x4096 bf16 matrices to fill 1 GiB, cycled.
  const int n_cold = quick ? 8 : 32;
  std::vector<Weight> cold(n_cold);
  for (auto& w : cold) w.w = filled(DType::bf16, {dim, dim}, pool);
  const double w_bytes = static_cast<double>(cold[0].w.nbytes());

  // Quantized cold weights: enough distinct 4096x4096 matrices per width to leave the caches.
  const std::vector<int> q_bits = {3, 4, 6, 8};
  std::vector<std::vector<Weight>> qcold;
  for (int bits : q_bits) {
    qcold.emplace_back(quick ? 4 : 12);
    for (size_t i = 0; i < qcold.back().size(); ++i) {
      const quant::QuantizedMatrix q = quant::quantize(cold[i % cold.size()].w, bits, 64, DType::bf16);
      Weight& w = qcold.back()[i];
      w.w = q.weight, w.scales = q.scales, w.biases = q.biases, w.bits = bits, w.group_size = 64;
    }
  }

  for (cpu::SimdLevel level : levels) {
    auto be = cpu::make_cpu_backend_at(level);
    std::printf("-- %s\n", cpu::simd_level_name(level));
    Tensor x1 = filled(DType::f32, {1, dim}, pool), y1 = be->alloc(DType::f32, {1, dim});
    for (DType wt : {DType::bf16, DType::f16, DType::f32}) {
      Weight w;
      w.w = wt == DType::bf16 ? cold[0].w : filled(wt, {dim, dim}, pool);
      be->matmul(x1, w, y1);
      const int calls = 10;
      double t = best_of(reps, [&] {
        for (int i = 0; i < calls; ++i) be->matmul(x1, w, y1);
      }) / calls;
      std::printf("gemv 4096x4096 %-8s hot : %7.3f ms  %6.1f GB/s of weight\n", dtype_name(wt), t * 1e3,
                  static_cast<double>(w.w.nbytes()) / t / 1e9);
    }
    double tc = best_of(quick ? 2 : 3, [&] {
      for (auto& w : cold) be->matmul(x1, w, y1);
    }) / n_cold;
    std::printf("gemv 4096x4096 bfloat16 cold: %7.3f ms  %6.1f GB/s of weight (%d distinct weights)\n", tc * 1e3,
                w_bytes / tc / 1e9, n_cold);
    for (size_t bi = 0; bi < q_bits.size(); ++bi) {
      const auto& ws = qcold[bi];
      double tq = best_of(quick ? 2 : 3, [&] {
        for (const auto& w : ws) be->matmul(x1, w, y1);
      }) / static_cast<double>(ws.size());
      const double bytes = static_cast<double>(ws[0].w.nbytes() + ws[0].scales.nbytes() + ws[0].biases.nbytes());
      std::printf("qgemv 4096x4096 %d-bit g64 cold: %7.3f ms  %6.1f GB/s of packed weight\n", q_bits[bi], tq * 1e3,
                  bytes / tq / 1e9);
    }
    // Token counts around the GEMV -> GEMM switch (cpu::kGemmMinTokens) and prefill chunk sizes.
    const std::vector<int64_t> ns = quick ? std::vector<int64_t>{4, 16, 128} : std::vector<int64_t>{4, 11, 12, 16, 128, 512};
    for (int64_t n : ns) {
      if (level == cpu::SimdLevel::scalar && n > 16) continue;  // minutes at scalar speed
      Tensor x = filled(DType::f32, {n, dim}, pool), y = be->alloc(DType::f32, {n, dim});
      double t = best_of(quick ? 2 : 3, [&] { be->matmul(x, cold[0], y); });
      std::printf("matmul n=%-4lld 4096x4096 bf16: %8.3f ms  %6.1f GFLOP/s\n", static_cast<long long>(n), t * 1e3,
                  2.0 * n * dim * dim / t / 1e9);
    }
    // Decode attention: 32 heads, 8 kv heads, head_dim 128, one token at position ctx-1.
    {
      AttnParams p;
      p.n_heads = 32;
      p.n_kv_heads = 8;
      p.head_dim = 128;
      p.scale = 0.088f;
      p.block_size = 16;
      const int64_t ctx = 4096;
      p.max_blocks = static_cast<int>(ctx / p.block_size);
      Tensor kc = filled(DType::f32, {ctx / p.block_size, p.block_size, 8 * 128}, pool);
      Tensor vc = filled(DType::f32, {ctx / p.block_size, p.block_size, 8 * 128}, pool);
      Tensor bt = Tensor::host(DType::i32, {p.max_blocks});
      for (int i = 0; i < p.max_blocks; ++i) bt.ptr<int32_t>()[i] = i;
      Tensor seq = Tensor::host(DType::i32, {1}), pos = Tensor::host(DType::i32, {1});
      pos.ptr<int32_t>()[0] = static_cast<int32_t>(ctx - 1);
      Tensor q = filled(DType::f32, {1, 32 * 128}, pool), out = be->alloc(DType::f32, {1, 32 * 128});
      double t = best_of(reps, [&] { be->attention(q, kc, vc, bt, seq, pos, p, out); });
      std::printf("attention decode ctx=4096 32/8 heads x 128: %7.3f ms  %6.1f GB/s of KV\n", t * 1e3,
                  2.0 * static_cast<double>(kc.nbytes()) / t / 1e9);
    }
  }
  return 0;
}
