#include "kiln/backend/kv_quant.h"

#include <algorithm>

#include "kiln/base/error.h"

namespace kiln::backend {

void check_kv_quant(const KvQuant& q, int head_dim) {
  if (!q.on()) return;
  if (q.bits != 4 && q.bits != 8) fail("kv", "--kv-bits {} is not supported (use 8 or 4)", q.bits);
  if (q.group_size <= 0 || head_dim % q.group_size != 0 || (q.group_size * q.bits) % 32 != 0)
    fail("kv", "--kv-group-size {} does not fit head_dim {} at {} bits (it must divide head_dim, and group x bits "
         "must be a multiple of 32)", q.group_size, head_dim, q.bits);
}

KvQuant resolve_kv_quant(int bits, int requested_group_size, int head_dim) {
  if (bits == 0) return {};
  KvQuant q{bits, std::min(requested_group_size, head_dim)};
  check_kv_quant(q, head_dim);
  return q;
}

size_t kv_row_bytes(const KvQuant& q, int64_t width, size_t float_bytes) {
  if (!q.on()) return static_cast<size_t>(width) * float_bytes;
  return static_cast<size_t>(width * q.bits / 8 + 2 * 2 * (width / q.group_size));
}

void quantize_kv_row(const float* x, int64_t width, const KvQuant& q, uint32_t* codes, uint16_t* scales,
                     uint16_t* biases) {
  const int64_t per_word = 32 / q.bits;
  std::fill(codes, codes + width / per_word, 0u);
  for (int64_t g = 0; g < width / q.group_size; ++g) {
    const float* w = x + g * q.group_size;
    float w_min = FLT_MAX, w_max = -FLT_MAX;
    for (int j = 0; j < q.group_size; ++j) {
      w_min = std::min(w_min, w[j]);
      w_max = std::max(w_max, w[j]);
    }
    float scale, bias;
    kv_group_params(w_min, w_max, q.bits, &scale, &bias);
    scales[g] = f32_to_f16(scale);
    biases[g] = f32_to_f16(bias);
    scale = f16_to_f32(scales[g]);
    bias = f16_to_f32(biases[g]);
    for (int j = 0; j < q.group_size; ++j) {
      const int64_t i = g * q.group_size + j;
      codes[i / per_word] |= kv_code(w[j], scale, bias, q.bits) << ((i % per_word) * q.bits);
    }
  }
}

void dequantize_kv_row(const uint32_t* codes, const uint16_t* scales, const uint16_t* biases, int64_t width,
                       const KvQuant& q, float* out) {
  // The LSB-first stream read as bytes (little-endian hosts): 8-bit = a code a byte, 4-bit = two,
  // the lower nibble first.
  const uint8_t* c = reinterpret_cast<const uint8_t*>(codes);
  const int64_t gs = q.group_size;
  for (int64_t g = 0; g < width / gs; ++g) {
    const float s = f16_to_f32(scales[g]), b = f16_to_f32(biases[g]);
    float* o = out + g * gs;
    if (q.bits == 8) {
      const uint8_t* cg = c + g * gs;
      for (int64_t j = 0; j < gs; ++j) o[j] = static_cast<float>(cg[j]) * s + b;
    } else {
      const uint8_t* cg = c + g * gs / 2;
      for (int64_t j = 0; j < gs / 2; ++j) {
        o[2 * j] = static_cast<float>(cg[j] & 15) * s + b;
        o[2 * j + 1] = static_cast<float>(cg[j] >> 4) * s + b;
      }
    }
  }
}

}  // namespace kiln::backend
