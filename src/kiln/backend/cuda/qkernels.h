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
// f32 accumulation, one rounding on store. 4-bit: tensor-core kernel, 8 tokens per pass over the
// packed weights; other widths: CUDA-core kernel, one pass per token.
void launch_qgemv(const void* x, int64_t n, const QWeightArgs& w, const void* bias, Dt bt, void* y, Dt yt,
                  cudaStream_t s);
// dst [n_rows, in] (dtype dt: bf16 or f32) = dequantized rows of w (scale * q + bias in f32, one
// rounding): row i is w's row rows[i], or r0 + i when rows is null; rows outside [0, out) give zeros.
void launch_qdequant_rows(const QWeightArgs& w, const int32_t* rows, int64_t r0, int64_t n_rows, void* dst, Dt dt,
                          cudaStream_t s);

// Whether 4-bit weights take the tensor-core GEMV (default; KILN_CUDA_QGEMV=ffma forces the generic
// CUDA-core kernel every width uses, for comparison and tests).
bool qgemv_use_mma();
// qgemv_fast.cu: the batch-1 4-bit tensor-core GEMV with x in shared memory and 16 units of weight
// words in flight per lane; launch_qgemv takes it when qgemv_fast_enabled() (KILN_CUDA_QGEMV=fast)
// and qgemv_fast_supported(n, w).
bool qgemv_fast_enabled();
bool qgemv_fast_supported(int64_t n, const QWeightArgs& w);
void launch_qgemv4_fast(const void* x, const QWeightArgs& w, const void* bias, Dt bt, void* y, Dt yt,
                        cudaStream_t s);
// Tokens up to which the quantized GEMV runs rather than dequantize + cuBLASLt: the tensor-core
// kernel costs about the same for 1..8 tokens per pass; the CUDA-core kernel's cost grows with the
// tokens (measured on the H200: 8 tokens ran at 6% of the copy rate), so it takes single tokens only.
inline int64_t qgemv_max_tokens(int bits) { return bits == 4 && qgemv_use_mma() ? 16 : 1; }

}  // namespace kiln::backend::cuda
