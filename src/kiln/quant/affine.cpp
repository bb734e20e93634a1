// The reference affine quantizer: packing, MLX's per-group rule, quantize/dequantize of matrices.
// Plain loops: used by `kiln convert` (once per model) and as the oracle of the CPU/CUDA kernels.
#include "kiln/quant/affine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kiln/base/error.h"

namespace kiln::quant {

bool valid_bits(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8; }
bool valid_group_size(int g) { return g == 32 || g == 64 || g == 128; }

void check_params(int bits, int group_size, const std::string& where) {
  if (!valid_bits(bits)) fail("quant", "{}: bits {} is not supported (use 2, 3, 4, 5, 6 or 8)", where, bits);
  if (!valid_group_size(group_size))
    fail("quant", "{}: group_size {} is not supported (use 32, 64 or 128)", where, group_size);
}

// Code i occupies bits [i*bits, (i+1)*bits) of the row's stream; stream bit j is bit j%32 of word j/32.
// For bits 2/4/8 that is "32/bits codes per word, the first in the lowest bits"; for 3/5/6 it is
// MLX's byte packing (8 codes in 3 or 5 bytes, 4 codes in 3 bytes), which is the same stream.
void pack_codes(const uint8_t* q, int64_t n, int bits, uint32_t* words) {
  KILN_ASSERT((n * bits) % 32 == 0);
  std::memset(words, 0, static_cast<size_t>(n * bits / 32) * 4);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bit = static_cast<uint64_t>(i) * bits;
    const uint64_t v = static_cast<uint64_t>(q[i]) << (bit % 32);
    words[bit / 32] |= static_cast<uint32_t>(v);
    if ((bit % 32) + bits > 32) words[bit / 32 + 1] |= static_cast<uint32_t>(v >> 32);
  }
}

void unpack_codes(const uint32_t* words, int64_t n, int bits, uint8_t* q) {
  const uint32_t mask = (1u << bits) - 1;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bit = static_cast<uint64_t>(i) * bits;
    uint64_t v = words[bit / 32];
    if ((bit % 32) + bits > 32) v |= static_cast<uint64_t>(words[bit / 32 + 1]) << 32;
    q[i] = static_cast<uint8_t>((v >> (bit % 32)) & mask);
  }
}

void quantize_group(const float* w, int group_size, int bits, uint8_t* q, float* scale_out, float* bias_out) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  // MLX's Metal kernel starts w_min at the dtype's max and w_max at 0 (so w_max >= 0 always).
  float w_min = std::numeric_limits<float>::max(), w_max = 0.0f;
  for (int j = 0; j < group_size; ++j) {
    w_min = std::min(w_min, w[j]);
    w_max = std::max(w_max, w[j]);
  }
  float scale = std::max((w_max - w_min) / n_bins, eps);
  const bool side = std::fabs(w_min) > std::fabs(w_max);
  scale = side ? scale : -scale;
  const float edge = side ? w_min : w_max;
  const float q0 = std::round(edge / scale);  // Metal round(): half away from zero
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
  for (int j = 0; j < group_size; ++j) {
    float v = std::round((w[j] - bias) / scale);
    v = std::min(std::max(v, 0.0f), n_bins);
    q[j] = static_cast<uint8_t>(v);
  }
  *scale_out = scale;
  *bias_out = bias;
}

static void store_as(DType t, void* base, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
    case DType::f16: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); break;
    default: fail("quant", "cannot store {} values", dtype_name(t));
  }
}

static bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

QuantizedMatrix quantize(const Tensor& w, int bits, int group_size, DType scale_dtype) {
  check_params(bits, group_size, "quantize");
  if (!is_float(w.dtype) || w.ndim() != 2)
    fail("quant", "quantize: expected a 2-D float matrix, got {} {}", dtype_name(w.dtype), shape_str(w.shape));
  if (!is_float(scale_dtype)) fail("quant", "quantize: scales dtype {} is not a float type", dtype_name(scale_dtype));
  const int64_t out = w.dim(0), in = w.dim(1);
  if (in % group_size != 0)
    fail("quant", "quantize: input dimension {} is not a multiple of group_size {}", in, group_size);
  const int64_t n_groups = in / group_size, words = packed_words(in, bits);
  QuantizedMatrix r;
  r.bits = bits;
  r.group_size = group_size;
  r.weight = Tensor::host(DType::u32, {out, words});
  r.scales = Tensor::host(scale_dtype, {out, n_groups});
  r.biases = Tensor::host(scale_dtype, {out, n_groups});
  std::vector<float> row(in);
  std::vector<uint8_t> q(in);
  for (int64_t o = 0; o < out; ++o) {
    to_f32(static_cast<const char*>(w.data) + o * in * dtype_size(w.dtype), w.dtype, row.data(), in);
    for (int64_t g = 0; g < n_groups; ++g) {
      float s, b;
      quantize_group(row.data() + g * group_size, group_size, bits, q.data() + g * group_size, &s, &b);
      store_as(scale_dtype, r.scales.data, o * n_groups + g, s);
      store_as(scale_dtype, r.biases.data, o * n_groups + g, b);
    }
    pack_codes(q.data(), in, bits, r.weight.ptr<uint32_t>() + o * words);
  }
  return r;
}

void check_layout(const Tensor& weight, const Tensor& scales, const Tensor& biases, int bits, int group_size,
                  const std::string& name) {
  check_params(bits, group_size, name);
  if (weight.dtype != DType::u32 || weight.ndim() != 2)
    fail("quant", "{}.weight: a quantized weight must be 2-D uint32, got {} {}", name, dtype_name(weight.dtype),
         shape_str(weight.shape));
  if ((weight.dim(1) * 32) % bits != 0)
    fail("quant", "{}.weight: {} words per row do not hold whole {}-bit codes", name, weight.dim(1), bits);
  const int64_t in = weight.dim(1) * 32 / bits;
  if (in % group_size != 0)
    fail("quant", "{}: input dimension {} (from {} words at {} bits) is not a multiple of group_size {}; "
         "check the bits/group_size in config.json's quantization section", name, in, weight.dim(1), bits, group_size);
  const Shape want{weight.dim(0), in / group_size};
  for (const Tensor* t : {&scales, &biases}) {
    const char* what = t == &scales ? "scales" : "biases";
    if (!is_float(t->dtype) || t->shape != want)
      fail("quant", "{}.{} is {} {}; {}-bit group-{} quantization of {} implies a float tensor {}", name, what,
           dtype_name(t->dtype), shape_str(t->shape), bits, group_size, shape_str(weight.shape), shape_str(want));
  }
}

Tensor dequantize(const QuantizedMatrix& q, DType dtype) {
  check_layout(q.weight, q.scales, q.biases, q.bits, q.group_size, "dequantize");
  if (!is_float(dtype)) fail("quant", "dequantize: {} is not a float type", dtype_name(dtype));
  const int64_t out = q.weight.dim(0), in = q.in_features(), n_groups = in / q.group_size;
  const int64_t words = q.weight.dim(1);
  Tensor r = Tensor::host(dtype, {out, in});
  std::vector<uint8_t> codes(in);
  std::vector<float> s(n_groups), b(n_groups);
  for (int64_t o = 0; o < out; ++o) {
    unpack_codes(q.weight.ptr<uint32_t>() + o * words, in, q.bits, codes.data());
    to_f32(static_cast<const char*>(q.scales.data) + o * n_groups * dtype_size(q.scales.dtype), q.scales.dtype,
           s.data(), n_groups);
    to_f32(static_cast<const char*>(q.biases.data) + o * n_groups * dtype_size(q.biases.dtype), q.biases.dtype,
           b.data(), n_groups);
    for (int64_t k = 0; k < in; ++k) {
      const int64_t g = k / q.group_size;
      store_as(dtype, r.data, o * in + k, s[g] * static_cast<float>(codes[k]) + b[g]);
    }
  }
  return r;
}

float affine_error_bound(float scale) { return std::fabs(scale) * 0.5f; }

}  // namespace kiln::quant
