// The KV cache's affine rule (backend/kv_quant.h): the row round trip within its error bound at
// 8 and 4 bits over groups of 8..128 and value scales from 1e-3 to 1e3, constant and all-negative
// groups, the parameter checks and the per-token byte count.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kiln/backend/kv_quant.h"
#include "kiln/base/error.h"

namespace kiln::backend {
namespace {

// |x - dequantized x|: the codes are rounded against the stored (f16) scale and bias, so half a
// step; a value past the stored range (its min below the rounded bias, its max past bias + n steps
// of the rounded scale) is clamped, off by at most the f16 rounding of bias (2^-11 relative) plus n
// times that of scale, or 2^-25 absolute each where f16 is subnormal (a scale under 6.1e-5: a group
// spanning less than ~0.016 at 8 bits keeps its absolute accuracy, not its relative one); plus f32 slack.
double bound(float scale, float bias, int bits) {
  const double s = std::fabs(scale), u = std::ldexp(1.0, -11), sub = std::ldexp(1.0, -25);
  const double n = (1 << bits) - 1;
  return 0.5 * s + n * (s * u + sub) + std::fabs(bias) * u + sub + 1e-6 * (s * n + std::fabs(bias));
}

TEST(KvQuant, RowRoundTripWithinBound) {
  std::mt19937 gen(7);
  for (int bits : {8, 4})
    for (int group : {8, 32, 64, 128})
      for (float mag : {1e-3f, 1.0f, 30.0f, 1e3f}) {
        const int64_t width = 256;
        const KvQuant q{bits, group};
        std::uniform_real_distribution<float> d(-mag, mag);
        std::vector<float> x(width), y(width);
        for (float& v : x) v = d(gen);
        x[3] = 0.0f;
        for (int j = 0; j < group; ++j) x[group + j] = -std::fabs(x[group + j]) - mag;  // an all-negative group
        for (int j = 0; j < group && 2 * group + j < width; ++j) x[2 * group + j] = 0.25f * mag;  // constant group
        std::vector<uint32_t> codes(width * bits / 32);
        std::vector<uint16_t> sc(width / group), bi(width / group);
        quantize_kv_row(x.data(), width, q, codes.data(), sc.data(), bi.data());
        dequantize_kv_row(codes.data(), sc.data(), bi.data(), width, q, y.data());
        double err = 0, steps = 0;  // rounding error is ~uniform in half a step: its mean ~ a quarter step (f16-normal scales)
        for (int64_t i = 0; i < width; ++i) {
          const float s = f16_to_f32(sc[i / group]), b = f16_to_f32(bi[i / group]);
          ASSERT_LE(std::fabs(x[i] - y[i]), bound(s, b, bits))
              << "bits " << bits << " group " << group << " mag " << mag << " i " << i << " x " << x[i];
          err += std::fabs(x[i] - y[i]);
          steps += std::fabs(s);
        }
        if (mag >= 1) {
          EXPECT_LT(err, 0.35 * steps) << "bits " << bits << " group " << group << " mag " << mag;
        }
        // a constant group comes back exactly up to the f16 rounding of its bias (its only level)
        if (3 * group <= width) {
          for (int j = 0; j < group; ++j) EXPECT_NEAR(y[2 * group + j], 0.25f * mag, 0.25f * mag * 1e-3f);
        }
      }
}

TEST(KvQuant, ChecksAndResolve) {
  EXPECT_NO_THROW(check_kv_quant({8, 64}, 128));
  EXPECT_NO_THROW(check_kv_quant({4, 8}, 8));
  EXPECT_THROW(check_kv_quant({3, 64}, 128), Error);
  EXPECT_THROW(check_kv_quant({8, 48}, 128), Error);   // does not divide head_dim
  EXPECT_THROW(check_kv_quant({4, 4}, 8), Error);      // 16 bits: groups would not start on words
  EXPECT_EQ(resolve_kv_quant(8, 64, 8), (KvQuant{8, 8}));  // stories260K: head_dim 8
  EXPECT_EQ(resolve_kv_quant(4, 64, 128), (KvQuant{4, 64}));
  EXPECT_EQ(resolve_kv_quant(0, 64, 128), KvQuant{});
  EXPECT_EQ(resolve_kv_quant(8, 64, 12), (KvQuant{8, 12}));
  EXPECT_THROW(resolve_kv_quant(4, 64, 12), Error);  // 12 x 4 bits: not whole words
}

TEST(KvQuant, RowBytes) {
  // llama-3-8b: 8 kv heads x 128; 8-bit groups of 64: 1024 codes + 16 x (scale + bias) x 2 bytes
  EXPECT_EQ(kv_row_bytes({8, 64}, 1024, 2), 1024u + 64u);
  EXPECT_EQ(kv_row_bytes({4, 64}, 1024, 2), 512u + 64u);
  EXPECT_EQ(kv_row_bytes({}, 1024, 2), 2048u);
}

}  // namespace
}  // namespace kiln::backend
