// MLX affine group quantization (mode "affine"), bit for bit as mlx-lm writes it (docs/quantization.md).
// A weight [out, in] becomes: weight u32 [out, in * bits / 32] (each row an LSB-first bit stream of
// `in` codes, little-endian words), scales and biases [out, in / group_size] in the model dtype;
// value = scale * q + bias with q in [0, 2^bits - 1]. This is the reference the kernels are tested against.
#pragma once
#include <cstdint>
#include <string>

#include "kiln/tensor/tensor.h"

namespace kiln::quant {

// bits in {2, 3, 4, 5, 6, 8}; group_size in {32, 64, 128}.
bool valid_bits(int bits);
bool valid_group_size(int group_size);
// Throws [quant] naming `where` when bits or group_size are not supported.
void check_params(int bits, int group_size, const std::string& where);

// u32 words of one packed row of `in` codes (in * bits must be a multiple of 32).
inline int64_t packed_words(int64_t in, int bits) { return in * bits / 32; }

// codes q[0..n) (each < 2^bits) -> the LSB-first bit stream in words[0 .. n*bits/32); n*bits % 32 == 0.
void pack_codes(const uint8_t* q, int64_t n, int bits, uint32_t* words);
// The inverse: words -> q[0..n).
void unpack_codes(const uint32_t* words, int64_t n, int bits, uint8_t* q);

// One group with MLX's rule (the Metal kernel mlx-community folders come from):
//   w_max = max(0, max w), w_min = min w; scale = max((w_max - w_min) / (2^bits - 1), 1e-7),
//   negated unless |w_min| > |w_max|; edge = the larger-magnitude end; q0 = round(edge / scale)
//   (half away from zero); if q0 != 0: scale = edge / q0, bias = edge, else bias = 0;
//   q = clamp(round((w - bias) / scale), 0, 2^bits - 1). All in f32; scale/bias are returned in f32
//   (the caller rounds them to the model dtype, as MLX stores them, after computing the codes).
void quantize_group(const float* w, int group_size, int bits, uint8_t* q, float* scale, float* bias);

// A quantized matrix in MLX's layout.
struct QuantizedMatrix {
  Tensor weight;          // u32 [out, in * bits / 32]
  Tensor scales, biases;  // [out, in / group_size], dtype of the source (f32/bf16/f16)
  int bits = 0, group_size = 0;
  int64_t in_features() const { return weight.dim(1) * 32 / bits; }
};

// Quantizes a float matrix w [out, in] (f32/bf16/f16); in % group_size must be 0. scales/biases
// get `scale_dtype` (MLX keeps the weight's dtype).
QuantizedMatrix quantize(const Tensor& w, int bits, int group_size, DType scale_dtype);
// w [out, in] in `dtype`: each value computed in f32 as scale * q + bias, then rounded once.
Tensor dequantize(const QuantizedMatrix& q, DType dtype);
// Checks the shapes/dtypes of weight/scales/biases against bits and group_size; throws [quant]
// naming `name` when they disagree (a malformed folder must not read out of bounds).
void check_layout(const Tensor& weight, const Tensor& scales, const Tensor& biases, int bits, int group_size,
                  const std::string& name);

// The largest |w - dequantized w| the affine rule allows in a group whose codes were not clamped:
// half a step, |scale| / 2 (plus the rounding of scale/bias to their dtype; see the tests).
float affine_error_bound(float scale);

}  // namespace kiln::quant
