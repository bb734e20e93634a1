// Helpers shared by the CPU backend tests: a seeded RNG that prints its seed (KILN_TEST_SEED=<n>
// replays a run), random tensors of any float dtype, conversions back to floats, and the
// parameterization over every SIMD level this machine supports.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln::backend::cpu {
// gtest prints the level by name in failure messages (found by ADL next to SimdLevel).
inline void PrintTo(SimdLevel l, std::ostream* os) { *os << simd_level_name(l); }
}  // namespace kiln::backend::cpu

namespace kiln::backend::cpu::test {

class Rng {
 public:
  explicit Rng(const char* what) {
    const char* e = std::getenv("KILN_TEST_SEED");
    seed_ = e ? std::strtoull(e, nullptr, 10) : std::random_device{}();
    std::printf("[seed] %s: KILN_TEST_SEED=%llu\n", what, static_cast<unsigned long long>(seed_));
    gen_.seed(seed_);
  }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int64_t uniform_int(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }
  std::mt19937_64& gen() { return gen_; }

  // A host tensor of values uniform in [-scale, scale], stored in dtype t (rounded to it).
  Tensor tensor(DType t, Shape s, float scale = 1.0f) {
    Tensor r = Tensor::host(t, std::move(s));
    const int64_t n = r.numel();
    for (int64_t i = 0; i < n; ++i) {
      float v = uniform(-scale, scale);
      switch (t) {
        case DType::f32: r.ptr<float>()[i] = v; break;
        case DType::bf16: r.ptr<uint16_t>()[i] = f32_to_bf16(v); break;
        case DType::f16: r.ptr<uint16_t>()[i] = f32_to_f16(v); break;
        default: ADD_FAILURE() << "Rng::tensor of " << dtype_name(t);
      }
    }
    return r;
  }

 private:
  uint64_t seed_;
  std::mt19937_64 gen_;
};

// The values of a float tensor as f32 (exact for bf16/f16).
inline std::vector<float> to_floats(const Tensor& t) {
  std::vector<float> r(t.numel());
  kiln::to_f32(t.data, t.dtype, r.data(), t.numel());
  return r;
}

// A host i32 tensor holding v.
inline Tensor host_ints(const std::vector<int32_t>& v) {
  Tensor t = Tensor::host(DType::i32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

// A tensor of dtype t on backend be filled with NaN bytes (bf16 0xFFFF / f32 NaN), so an output
// element an op forgets to write fails the comparison.
inline Tensor poisoned(Backend& be, DType t, Shape s) {
  Tensor h = Tensor::host(t, std::move(s));
  std::memset(h.data, 0xFF, h.nbytes());
  return be.upload(h);
}

inline void fill_nan(Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = std::numeric_limits<float>::quiet_NaN();
}

inline std::vector<SimdLevel> available_levels() {
  std::vector<SimdLevel> r;
  for (SimdLevel l : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512, SimdLevel::avx512vnni})
    if (static_cast<int>(l) <= static_cast<int>(best_simd_level())) r.push_back(l);
  return r;
}

inline std::string level_name(const ::testing::TestParamInfo<SimdLevel>& info) { return simd_level_name(info.param); }

class LevelTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  std::unique_ptr<CpuBackend> backend() {
    auto be = make_cpu_backend_at(GetParam());
    EXPECT_EQ(be->simd_level(), GetParam());
    return be;
  }
};

// Error statistics of a device result against the CPU's f32 reference into *st, asserting equal sizes and
// that every device value is finite (outputs are poisoned with NaN first, so a finite value was written).
// Call as ASSERT_NO_FATAL_FAILURE(close_stats(...)).
struct CloseStats {
  double sq_err = 0, sq_ref = 0, max_err = 0, max_ref = 0;  // Σ e², Σ ref², max |e|, max |ref|
};
inline void close_stats(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what,
                        CloseStats* st) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " is " << got[i] << " (not written?)";
    const double e = std::abs(double(got[i]) - ref[i]);
    st->sq_err += e * e;
    st->sq_ref += double(ref[i]) * ref[i];
    st->max_err = std::max(st->max_err, e);
    st->max_ref = std::max(st->max_ref, std::abs(double(ref[i])));
  }
}

// Dense random experts for the MoE op tests (CPU defaults and CUDA parity): gate/up [ffn, dim],
// down [dim, ffn], entries ~ 1/sqrt(fan-in) so outputs stay O(1).
struct Experts {
  std::vector<Weight> gate, up, down;
  std::vector<ExpertWeights> refs() const {
    std::vector<ExpertWeights> r(gate.size());
    for (size_t e = 0; e < gate.size(); ++e) r[e] = {&gate[e], &up[e], &down[e]};
    return r;
  }
};

inline Experts random_experts(Rng& rng, DType wt, int64_t n_experts, int64_t dim, int64_t ffn) {
  Experts ex;
  auto dense = [](Tensor t) {
    Weight w;
    w.w = std::move(t);
    return w;
  };
  for (int64_t e = 0; e < n_experts; ++e) {
    ex.gate.push_back(dense(rng.tensor(wt, {ffn, dim}, 1.0f / std::sqrt(float(dim)))));
    ex.up.push_back(dense(rng.tensor(wt, {ffn, dim}, 1.0f / std::sqrt(float(dim)))));
    ex.down.push_back(dense(rng.tensor(wt, {dim, ffn}, 1.0f / std::sqrt(float(ffn)))));
  }
  return ex;
}

}  // namespace kiln::backend::cpu::test
