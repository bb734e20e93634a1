// The MLX affine layout: pack/unpack round trips for every bit width and group size, the exact
// bit positions of MLX's packing (2/4/8 bits: 32/bits codes per word, first code lowest; 3/5/6:
// MLX's byte packing), MLX's per-group rule (edge exact, zero exact), and quantize -> dequantize
// error within the affine bound. Random inputs are seeded and the seed printed (KILN_TEST_SEED).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kiln/quant/affine.h"

using namespace kiln;
using namespace kiln::quant;

namespace {

uint64_t test_seed(const char* what) {
  const char* e = std::getenv("KILN_TEST_SEED");
  uint64_t s = e ? std::strtoull(e, nullptr, 10) : std::random_device{}();
  std::printf("[seed] %s: KILN_TEST_SEED=%llu\n", what, static_cast<unsigned long long>(s));
  return s;
}

const int kBits[] = {2, 3, 4, 5, 6, 8};
const int kGroups[] = {32, 64, 128};

}  // namespace

TEST(AffinePack, RoundTripEveryBitWidthAndGroupSize) {
  std::mt19937_64 gen(test_seed("pack round trip"));
  for (int bits : kBits)
    for (int gs : kGroups) {
      const int64_t n = gs * 3;  // three groups in one row
      std::vector<uint8_t> q(n), back(n);
      std::uniform_int_distribution<int> d(0, (1 << bits) - 1);
      for (auto& v : q) v = static_cast<uint8_t>(d(gen));
      q[0] = static_cast<uint8_t>((1 << bits) - 1);  // the extremes, too
      q[n - 1] = 0;
      std::vector<uint32_t> words(packed_words(n, bits));
      pack_codes(q.data(), n, bits, words.data());
      unpack_codes(words.data(), n, bits, back.data());
      EXPECT_EQ(q, back) << bits << " bits, group " << gs;
    }
}

TEST(AffinePack, MatchesMlxBitPositions) {
  // 4 bits: 8 codes per word, code i at bits [4i, 4i+4).
  {
    std::vector<uint8_t> q = {1, 2, 3, 4, 5, 6, 7, 8, 15, 0, 0, 0, 0, 0, 0, 9};
    std::vector<uint32_t> w(2);
    pack_codes(q.data(), 16, 4, w.data());
    EXPECT_EQ(w[0], 0x87654321u);
    EXPECT_EQ(w[1], 0x9000000Fu);
  }
  // 8 bits: 4 bytes per word, little-endian.
  {
    std::vector<uint8_t> q = {0x11, 0x22, 0x33, 0x44};
    uint32_t w = 0;
    pack_codes(q.data(), 4, 8, &w);
    EXPECT_EQ(w, 0x44332211u);
  }
  // 3 bits: MLX packs 8 codes into 3 bytes: b0 = q0 | q1<<3 | (q2&3)<<6, b1 = q2>>2 | q3<<1 | q4<<4 |
  // (q5&1)<<7, b2 = q5>>1 | q6<<2 | q7<<5 (its CPU/Metal extract_bits read them back this way).
  {
    std::vector<uint8_t> q(32);
    for (int i = 0; i < 32; ++i) q[i] = static_cast<uint8_t>((i * 5 + 3) & 7);
    std::vector<uint32_t> w(3);
    pack_codes(q.data(), 32, 3, w.data());
    const uint8_t* b = reinterpret_cast<const uint8_t*>(w.data());
    for (int p = 0; p < 4; ++p) {
      const uint8_t* c = q.data() + 8 * p;
      const uint8_t* by = b + 3 * p;
      EXPECT_EQ(by[0], static_cast<uint8_t>(c[0] | (c[1] << 3) | ((c[2] & 3) << 6)));
      EXPECT_EQ(by[1], static_cast<uint8_t>((c[2] >> 2) | (c[3] << 1) | (c[4] << 4) | ((c[5] & 1) << 7)));
      EXPECT_EQ(by[2], static_cast<uint8_t>((c[5] >> 1) | (c[6] << 2) | (c[7] << 5)));
    }
  }
  // 6 bits: 4 codes into 3 bytes: b0 = q0 | (q1&3)<<6, b1 = q1>>2 | (q2&15)<<4, b2 = q2>>4 | q3<<2.
  {
    std::vector<uint8_t> q(16);
    for (int i = 0; i < 16; ++i) q[i] = static_cast<uint8_t>((i * 37 + 11) & 63);
    std::vector<uint32_t> w(3);
    pack_codes(q.data(), 16, 6, w.data());
    const uint8_t* b = reinterpret_cast<const uint8_t*>(w.data());
    for (int p = 0; p < 4; ++p) {
      const uint8_t* c = q.data() + 4 * p;
      const uint8_t* by = b + 3 * p;
      EXPECT_EQ(by[0], static_cast<uint8_t>(c[0] | ((c[1] & 3) << 6)));
      EXPECT_EQ(by[1], static_cast<uint8_t>((c[1] >> 2) | ((c[2] & 15) << 4)));
      EXPECT_EQ(by[2], static_cast<uint8_t>((c[2] >> 4) | (c[3] << 2)));
    }
  }
  // 5 bits: 8 codes into 5 bytes, b0 = q0 | (q1&7)<<5, b1 = q1>>3 | q2<<2 | (q3&1)<<7, ...
  {
    std::vector<uint8_t> q(32);
    for (int i = 0; i < 32; ++i) q[i] = static_cast<uint8_t>((i * 13 + 7) & 31);
    std::vector<uint32_t> w(5);
    pack_codes(q.data(), 32, 5, w.data());
    const uint8_t* b = reinterpret_cast<const uint8_t*>(w.data());
    for (int p = 0; p < 4; ++p) {
      const uint8_t* c = q.data() + 8 * p;
      const uint8_t* by = b + 5 * p;
      EXPECT_EQ(by[0], static_cast<uint8_t>(c[0] | ((c[1] & 7) << 5)));
      EXPECT_EQ(by[1], static_cast<uint8_t>((c[1] >> 3) | (c[2] << 2) | ((c[3] & 1) << 7)));
      EXPECT_EQ(by[2], static_cast<uint8_t>((c[3] >> 1) | ((c[4] & 15) << 4)));
      EXPECT_EQ(by[3], static_cast<uint8_t>((c[4] >> 4) | (c[5] << 1) | ((c[6] & 3) << 6)));
      EXPECT_EQ(by[4], static_cast<uint8_t>((c[6] >> 2) | (c[7] << 3)));
    }
  }
}

TEST(AffineRule, EdgeAndZeroAreExact) {
  // A group whose larger-magnitude end is negative: scale > 0, bias = w_min, code 0 = w_min exactly.
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[i] = -1.0f + 1.5f * static_cast<float>(i) / 31.0f;  // [-1, 0.5]
  std::vector<uint8_t> q(32);
  float s, b;
  quantize_group(w.data(), 32, 4, q.data(), &s, &b);
  EXPECT_GT(s, 0.0f);
  EXPECT_EQ(b, -1.0f);
  EXPECT_EQ(q[0], 0);
  // The rule snaps scale so that 0 is a code: -b / s is an integer.
  EXPECT_NEAR(-b / s, std::round(-b / s), 1e-4);
  // Positive dominant end: scale < 0 and bias = w_max, code 0 = w_max.
  for (auto& v : w) v = -v;
  quantize_group(w.data(), 32, 4, q.data(), &s, &b);
  EXPECT_LT(s, 0.0f);
  EXPECT_EQ(b, 1.0f);
  EXPECT_EQ(q[0], 0);
  // An all-positive group: MLX's w_min is the true minimum (not 0) and w_max the maximum.
  for (int i = 0; i < 32; ++i) w[i] = 2.0f + static_cast<float>(i) / 31.0f;  // [2, 3]
  quantize_group(w.data(), 32, 8, q.data(), &s, &b);
  EXPECT_EQ(b, 3.0f);
  EXPECT_NEAR(std::fabs(s), 1.0f / 255.0f, 1e-3f);
  // A constant zero group stays zero.
  std::fill(w.begin(), w.end(), 0.0f);
  quantize_group(w.data(), 32, 3, q.data(), &s, &b);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(s * q[i] + b, 0.0f);
}

TEST(AffineQuantize, DequantizeErrorWithinTheAffineBound) {
  std::mt19937_64 gen(test_seed("quantize error"));
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int bits : kBits)
    for (int gs : kGroups) {
      const int64_t out = 7, in = gs * 4;
      Tensor w = Tensor::host(DType::f32, {out, in});
      for (int64_t i = 0; i < w.numel(); ++i) w.ptr<float>()[i] = nd(gen);
      QuantizedMatrix q = quantize(w, bits, gs, DType::f32);
      ASSERT_EQ(q.weight.shape, (Shape{out, in * bits / 32}));
      ASSERT_EQ(q.scales.shape, (Shape{out, in / gs}));
      Tensor d = dequantize(q, DType::f32);
      std::vector<uint8_t> codes(in);
      double sq_err = 0, sq_w = 0;
      for (int64_t o = 0; o < out; ++o) {
        unpack_codes(q.weight.ptr<uint32_t>() + o * q.weight.dim(1), in, bits, codes.data());
        for (int64_t k = 0; k < in; ++k) {
          const float s = q.scales.ptr<float>()[o * (in / gs) + k / gs];
          const float x = w.ptr<float>()[o * in + k], y = d.ptr<float>()[o * in + k];
          const float err = std::fabs(x - y), slack = 1e-6f * (std::fabs(x) + 1e-3f);
          // Half a step for an unclamped code; the code at the far end may be clamped (the snapped
          // scale can be a little smaller than range / n_bins), at most one step.
          if (codes[k] < (1 << bits) - 1) EXPECT_LE(err, affine_error_bound(s) + slack) << bits << "b g" << gs;
          else EXPECT_LE(err, std::fabs(s) + slack) << bits << "b g" << gs;
          sq_err += static_cast<double>(err) * err;
          sq_w += static_cast<double>(x) * x;
        }
      }
      // The relative RMS error of a uniform quantizer: about 1 / (2^bits * sqrt(3)) of the range.
      const double rel = std::sqrt(sq_err / sq_w);
      EXPECT_LT(rel, 4.0 / (1 << bits)) << bits << "b g" << gs;
    }
}

TEST(AffineQuantize, Bf16ScalesStayWithinTheirRounding) {
  std::mt19937_64 gen(test_seed("bf16 quantize"));
  std::uniform_real_distribution<float> ud(-0.1f, 0.1f);
  const int64_t out = 5, in = 256;
  Tensor w = Tensor::host(DType::bf16, {out, in});
  for (int64_t i = 0; i < w.numel(); ++i) w.ptr<uint16_t>()[i] = f32_to_bf16(ud(gen));
  QuantizedMatrix q = quantize(w, 4, 64, DType::bf16);
  EXPECT_EQ(q.scales.dtype, DType::bf16);
  Tensor d = dequantize(q, DType::f32);
  std::vector<float> wf(w.numel());
  to_f32(w.data, w.dtype, wf.data(), w.numel());
  for (int64_t i = 0; i < w.numel(); ++i) {
    const float s = bf16_to_f32(q.scales.ptr<uint16_t>()[i / 64]);
    // Scale and bias each rounded to bf16 (8 bits of mantissa): up to 15 * |s| * 2^-8 + |b| * 2^-8 more.
    EXPECT_LE(std::fabs(wf[i] - d.ptr<float>()[i]), std::fabs(s) * (1.0f + 16.0f / 256.0f) + 0.1f / 256.0f);
  }
}

TEST(AffineQuantize, RejectsBadParamsAndLayouts) {
  Tensor w = Tensor::host(DType::f32, {2, 96});
  std::fill(w.ptr<float>(), w.ptr<float>() + w.numel(), 0.5f);
  EXPECT_THROW(quantize(w, 7, 32, DType::f32), Error);
  EXPECT_THROW(quantize(w, 4, 48, DType::f32), Error);
  EXPECT_THROW(quantize(w, 4, 64, DType::f32), Error);  // 96 % 64 != 0
  QuantizedMatrix q = quantize(w, 4, 32, DType::f32);
  EXPECT_NO_THROW(check_layout(q.weight, q.scales, q.biases, 4, 32, "w"));
  EXPECT_THROW(check_layout(q.weight, q.scales, q.biases, 8, 32, "w"), Error);   // implies in = 48: 48 % 32
  EXPECT_THROW(check_layout(q.weight, q.scales, q.biases, 2, 32, "w"), Error);   // scales would be [2, 6]
  EXPECT_THROW(check_layout(q.weight, q.scales, q.biases, 4, 64, "w"), Error);
}
