// The quantized KV cache's affine rule (KvTensor, backend.h): per group, scale and bias from the
// group's range, rounded to f16 as stored, then each value's code against the stored scale and bias
// (so the rounding of the parameters costs no extra error beyond a few f16 ulps). The rule itself is
// kv_quant_rule.h (host and device functions, shared with the CUDA kernels). Here: the checks, the
// sizes, and the host reference of one row (the CPU backend's write path and the oracle the
// attention kernels are tested against).
//
// Not MLX's weight rule (quant/affine.h, which makes 0 exact and starts the max at 0): K rows are
// mostly far from 0 within a group (RoPE'd keys of stories260K span ~11-23 per 8 values), where
// plain min/max gives a finer step; the measured KL is in docs/architecture.md.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kiln/backend/backend.h"
#include "kiln/backend/kv_quant_rule.h"

namespace kiln::backend {

// The checks of a quantized KV layout: bits 4 or 8; group_size > 0 dividing head_dim, with
// group_size * bits a multiple of 32 (groups start on word boundaries). Throws [kv] naming what.
void check_kv_quant(const KvQuant& q, int head_dim);
// The group size a model of head_dim uses for a requested one: min(requested, head_dim) (a tiny
// model's heads are narrower than mlx-lm's default 64), checked by check_kv_quant.
KvQuant resolve_kv_quant(int bits, int requested_group_size, int head_dim);
// Bytes one cached token of one layer's K (or V) takes for width values: codes + f16 scales/biases.
size_t kv_row_bytes(const KvQuant& q, int64_t width, size_t float_bytes);

// Host reference of one row of width values (width % group_size == 0): quantized with the rule
// above (scale and bias rounded to f16, then the codes, packed LSB-first into width * bits / 32
// words as mlx's quantize packs them), and back (value = code * scale + bias in f32 from the f16
// scale and bias).
void quantize_kv_row(const float* x, int64_t width, const KvQuant& q, uint32_t* codes, uint16_t* scales,
                     uint16_t* biases);
void dequantize_kv_row(const uint32_t* codes, const uint16_t* scales, const uint16_t* biases, int64_t width,
                       const KvQuant& q, float* out);

// A quantized cache plane set for n_rows rows of width values (host or device through `alloc`):
// data u32 [n_blocks, block_size, width * bits / 32], scales/biases f16 [n_blocks, block_size, width / g].
template <typename Alloc>
KvTensor make_kv_tensor(Alloc&& alloc, const KvQuant& q, int64_t n_blocks, int64_t block_size, int64_t width,
                        DType float_dtype) {
  KvTensor t;
  t.quant = q;
  if (!q.on()) {
    t.data = alloc(float_dtype, Shape{n_blocks, block_size, width});
    return t;
  }
  t.data = alloc(DType::u32, Shape{n_blocks, block_size, width * q.bits / 32});
  t.scales = alloc(DType::f16, Shape{n_blocks, block_size, width / q.group_size});
  t.biases = alloc(DType::f16, Shape{n_blocks, block_size, width / q.group_size});
  return t;
}

}  // namespace kiln::backend
