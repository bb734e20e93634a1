// Quantized weights (MLX affine layout, docs/quantization.md) on the CUDA backend: the host side
// of matmul and embedding for Weight::quantized() (validation, residency, kernel choice). Called
// from CudaBackend::matmul / ::embedding (cuda_ops.cpp); the kernels are in qmatmul.cu.
#pragma once
#include <span>

#include "kiln/backend/cuda/core/cuda_impl.h"

namespace kiln::backend::cuda {

// y [n, out] = x [n, in] · dequant(w)ᵀ (+ bias). Up to qgemv_max_tokens(bits) tokens (16 at 4 bits,
// else 1): the quantized GEMV; more: row chunks dequantized to bf16 in per-step buffers, then the
// dense cuBLASLt path of be.matmul. A 4-bit GEMV takes x's cached qx where its producer left one
// (Impl::cached_qx); both forms end only the cached qx of what they write (Impl::skip(y)).
void quantized_matmul(CudaBackend& be, CudaBackend::Impl& im, const Tensor& x, const Weight& w, Tensor& y);
// matmul_multi's quantized case: y_i = x · dequant(w_i)ᵀ for every i in one launch of the 4-bit
// tensor-core GEMV when all weights are 4-bit and x has at most qgemv_max_tokens(4) tokens; returns
// false (nothing done) otherwise, and the caller multiplies one weight at a time.
bool quantized_matmul_multi(CudaBackend& be, CudaBackend::Impl& im, const Tensor& x,
                            std::span<const Weight* const> ws, std::span<Tensor* const> ys);
// decoder_stack's 4-bit case (launch_q4_decoder): returns false (nothing done) unless it is on
// (Impl::fused_decoder), this is the process's only CudaBackend (live_cuda_backends), x is one bf16
// token, every layer's seven matrices are 4-bit of one group size and 2-byte scale dtype without
// biases, the norms and caches bf16, no softcap, full rotary, the shapes fit q4_decoder_fits and the
// context at most kDecoderMaxKeys keys (its attention takes a few key splits per head: fine for a
// chat turn, slower than the split-K kernel for long contexts).
constexpr int64_t kDecoderMaxKeys = 1024;
bool quantized_decoder_stack(CudaBackend& be, CudaBackend::Impl& im, const DecoderStackArgs& a, Tensor& x);
// out [n, dim] = dequantized rows ids[t] of the table (ids outside [0, vocab) give zero rows).
void quantized_embedding(CudaBackend& be, CudaBackend::Impl& im, const Weight& table, const Tensor& ids, Tensor& out);

}  // namespace kiln::backend::cuda
