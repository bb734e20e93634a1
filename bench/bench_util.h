// Helpers shared by the GPU micro-benchmarks (cuda_ceiling_bench, cuda_attn_bench): random bf16
// data and the median time of repeated batches of a backend call.
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

#include "kiln/backend/backend.h"

namespace kiln::bench {

// A host bf16 tensor of uniform values in [-1, 1] (xorshift; values matter for GEMM power draw).
inline Tensor random_bf16(Shape s, uint64_t seed) {
  Tensor t = Tensor::host(DType::bf16, std::move(s));
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
    t.ptr<uint16_t>()[i] = f32_to_bf16(static_cast<float>(z >> 40) / 8388608.0f - 1.0f);
  }
  return t;
}

// Seconds per call of f: 3 warm-up calls, then the median over 10 batches of per_batch calls.
template <typename F>
double median_seconds(backend::Backend& be, F&& f, int per_batch) {
  for (int i = 0; i < 3; ++i) f();
  be.synchronize();
  std::vector<double> ts;
  for (int r = 0; r < 10; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < per_batch; ++i) f();
    be.synchronize();
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / per_batch);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace kiln::bench
