// Launchers of the quantized-weight kernels (qmatmul.cu): MLX affine layout as docs/quantization.md
// states it (u32 words holding each row's LSB-first bit stream of `in` codes; scales/biases
// [out, in / group_size]; value = scale * q + bias). Plain C++ signatures like kernels.h; shapes and
// alignment are checked by the caller (cuda_qops.cpp). All launches are asynchronous on `s`.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/kernels.h"

namespace kiln::backend::cuda {

// One quantized matrix on the device. w: u32 [out, in * bits / 32], 16-byte aligned rows for bits
// 4/8 (8-byte for 2/6, 4-byte for 3/5), which in % 32 == 0 guarantees for an aligned base.
struct QWeightArgs {
  const uint32_t* w;
  const void* scales;  // [out, in / group_size], dtype sdt
  const void* biases;  // same shape and dtype
  Dt sdt;
  int bits, group_size;  // bits in {2,3,4,5,6,8}, group_size in {32,64,128}
  int64_t out, in;
};

// y [n, out] (dtype yt) = x [n, in] (bf16, 16-byte aligned) · dequant(w)ᵀ (+ bias [out] of dtype bt),
// f32 accumulation, one rounding on store. Streams the packed weights once per pass of 8 tokens.
void launch_qgemv(const void* x, int64_t n, const QWeightArgs& w, const void* bias, Dt bt, void* y, Dt yt,
                  cudaStream_t s);
// dst [n_rows, in] (dtype dt: bf16 or f32) = dequantized rows of w (scale * q + bias in f32, one
// rounding): row i is w's row rows[i], or r0 + i when rows is null; rows outside [0, out) give zeros.
void launch_qdequant_rows(const QWeightArgs& w, const int32_t* rows, int64_t r0, int64_t n_rows, void* dst, Dt dt,
                          cudaStream_t s);

// Up to this many tokens the quantized GEMV runs (passes of 8 over the packed weights: 4 passes of
// 0.5625 B/weight still read less than dequantizing to bf16 for cuBLASLt, which writes and reads
// 2 B/weight more); larger batches dequantize row chunks to bf16 and use the dense GEMM.
constexpr int64_t kQGemvMaxTokens = 32;

}  // namespace kiln::backend::cuda
