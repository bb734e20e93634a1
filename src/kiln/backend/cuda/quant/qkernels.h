// Launchers of the quantized-weight kernels (qmatmul.cu): MLX affine layout as docs/quantization.md
// states it (u32 words holding each row's LSB-first bit stream of `in` codes; scales/biases
// [out, in / group_size]; value = scale * q + bias). Plain C++ signatures like kernels.h; shapes and
// alignment are checked by the caller (cuda_qops.cpp). All launches are asynchronous on `s`.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/core/kernels.h"

namespace kiln::backend::cuda {

// One quantized matrix on the device, in one of two layouts:
//  - MLX (pairs null): w u32 [out, in * bits / 32], 16-byte aligned rows for bits 4/8 (8-byte for
//    2/6, 4-byte for 3/5), which in % 32 == 0 guarantees for an aligned base; scales/biases
//    [out, in / group_size] of dtype sdt;
//  - 4-bit tiled (pairs set; launch_q4_tile makes it): w the tiled codes, pairs the (scale, bias)
//    pairs (qmatmul.cu and docs/quantization.md give the order); scales/biases unused.
struct QWeightArgs {
  const uint32_t* w;
  const void* scales;  // [out, in / group_size], dtype sdt
  const void* biases;  // same shape and dtype
  Dt sdt;
  int bits, group_size;  // bits in {2,3,4,5,6,8}, group_size in {32,64,128}
  int64_t out, in;
  const void* pairs = nullptr;
};

// Byte sizes of a 4-bit matrix's tiled layout (16-row tiles x 128-code quads, zero-padded).
struct Q4Tiled {
  int64_t tiles, quads, code_bytes, pair_bytes;
};
Q4Tiled q4_tiled_sizes(int64_t out, int64_t in, int group_size, Dt sdt);
// Writes the tiled layout of the 4-bit MLX-layout matrix w into codes / pairs (q4_tiled_sizes bytes,
// 16-byte aligned).
void launch_q4_tile(const QWeightArgs& w, void* codes, void* pairs, cudaStream_t s);

// Up to kQMultiMax quantized matrices that multiply the same x in one launch (q/k/v, gate/up):
// y_i [n, out_i] (dtype yt[i]) = x · dequant(w_i)ᵀ (+ bias_i). tiles[i] = 16-row tiles before matrix i.
constexpr int kQMultiMax = 4;
struct QMulti {
  QWeightArgs w[kQMultiMax];
  const void* bias[kQMultiMax];
  Dt bt[kQMultiMax];
  void* y[kQMultiMax];
  Dt yt[kQMultiMax];
  int64_t tiles[kQMultiMax + 1];
  int count;
  void add(const QWeightArgs& q, const void* b, Dt btype, void* out, Dt otype) {
    w[count] = q, bias[count] = b, bt[count] = btype, y[count] = out, yt[count] = otype;
    tiles[count + 1] = tiles[count] + (q.out + 15) / 16;
    ++count;
  }
};

// y [n, out] (dtype yt) = x [n, in] (bf16, 16-byte aligned) · dequant(w)ᵀ (+ bias [out] of dtype bt),
// f32 accumulation, one rounding on store. 4-bit tiled: the tensor-core kernel (launch_qgemv_multi
// with one matrix; qx as there); MLX layout (other widths): CUDA-core kernel, one pass per token (qx
// unused). n_sms: the device's multiprocessors (the tensor-core kernel's block shape depends on how
// full they are).
void launch_qgemv(const void* x, int64_t n, const QWeightArgs& w, const void* bias, Dt bt, void* y, Dt yt,
                  int n_sms, void* qx, bool qx_ready, cudaStream_t s);
// The 4-bit tensor-core GEMV over every matrix of m (all 4-bit tiled, same in, scale dtype and group
// size) in one launch, 8 tokens per pass over the packed weights: x is first quantized per (token,
// group) to 15-bit integers (error at most 2^-16 of the group's max |x|) into qx (16-byte aligned
// device scratch of q4_qx_bytes; qx_ready: a producer kernel already wrote x's qx there, QxOut),
// then integer MMAs of the raw codes, each group's scale and bias applied to the exact sums in f32
// (qmatmul.cu). n <= qgemv_max_tokens(4).
void launch_qgemv_multi(const void* x, int64_t n, const QMulti& m, int n_sms, void* qx, bool qx_ready,
                        cudaStream_t s);
int64_t q4_qx_bytes(int64_t n, int64_t in, int group_size);
// Warps per tile of the 4-bit GEMV launch over `tiles` tiles in all: 8 where the tiles fit one wave
// of 8-warp blocks (two per SM: o and down of an 8B model), else 4 (q/k/v, gate/up: 1.45 waves of
// 8-warp blocks fit one of 4-warp blocks). A warp w of W takes quads [w Q / W, (w + 1) Q / W) of its
// tile. Measured on the H200, llama-3-8b 4-bit batch 1 decode: 410.7 / 411.3 tok/s against 406.5 /
// 405.1 with 8 warps for q/k/v too (the earlier rule, tiles < 4 x SMs); 4 warps everywhere and 8
// everywhere were slower than either (343.5 / 361.6 against 364.8 with an earlier kernel).
inline int q4_gemv_warps(int64_t tiles, int n_sms) { return tiles <= int64_t{n_sms} * 2 ? 8 : 4; }

// The persistent kernels' grid barrier (launch_q4_decoder): arrival counters, one per grid size, for
// grids of at most kGridMaxBlocks blocks.
constexpr int kGridMaxBlocks = 1024;
// One decode token (one sequence) through a stack of Llama-style pre-norm decoder layers in one
// persistent launch (qdecoder.cu): per layer x += o(attention(rope(q, k, v of rms_norm(x)))), then
// x += down(act(gate(n)) * up(n)) with n = rms_norm(x). All seven matrices of every layer 4-bit
// tiled, one scale dtype (bf16 or f16) and group size, no biases; bf16 activations, norms and
// caches; head_dim 64 or 128, full rotary, no softcap. The values of the separate ops (rms_norm /
// add_rms_norm, launch_qgemv_multi, rope_kv_write, attention, gated_act) up to f32 summation order.
// barrier: kGridMaxBlocks + 1 zeroed device words (the grid barrier's arrival counters), then the
// attention counters (QDecoder::counters). Nothing is launched where q4_decoder_fits is false.
constexpr int kQDecoderMaxLayers = 96, kQDecoderMaxDim = 8192, kQDecoderMaxHeads = 256;
struct QDecoderLayer {
  const void* attn_norm;  // bf16 [dim]
  const void* mlp_norm;
  const void* codes[7];  // q, k, v, o, gate, up, down: the tiled codes and (scale, bias) pairs
  const void* pairs[7];
  void* k_cache;  // bf16 [n_slots, n_kv_heads * head_dim]
  void* v_cache;
  int window;  // sliding window in tokens, 0 = full
};
struct QDecoder {
  QDecoderLayer layers[kQDecoderMaxLayers];  // a __grid_constant__ kernel parameter (~15 KB)
  int n_layers;
  int64_t dim, ffn, n_heads, n_kv_heads, head_dim, n_slots;
  Dt sdt;
  int group_size, act;  // act: Activation (0 silu, 1 gelu_tanh, 2 gelu)
  float eps, scale, attn_factor;
  const float* inv_freq;                      // [head_dim / 2]
  const int32_t *pos, *slots, *token_seq;     // [1]
  const int32_t* block_tables;                // [n_seqs, max_blocks]
  int block_size, max_blocks;
  void* x;                    // bf16 [dim]: the residual, in and out
  void *qkv, *attn, *h;       // bf16 scratch: [q_out + 2 kv_out], [q_out], [ffn]
  float* partials;            // f32 scratch: q4_decoder_partial_floats (the attention's key splits)
  unsigned* counters;         // [n_heads] zeros, left zero (the splits' arrivals)
};
// The words of the backend's barrier buffer: the grid barrier's kGridMaxBlocks + 1, then the
// decoder's attention counters (QDecoder::counters, kQDecoderMaxHeads unsigned).
constexpr int kGridBarrierWords = kGridMaxBlocks + 1 + kQDecoderMaxHeads / 2;
bool q4_decoder_fits(const QDecoder& d, int n_sms);
int64_t q4_decoder_partial_floats(const QDecoder& d, int n_sms);
void launch_q4_decoder(const QDecoder& d, unsigned long long* barrier, int n_sms, cudaStream_t s);

// dst [n_rows, in] (dtype dt: bf16 or f32) = dequantized rows of w (scale * q + bias in f32, one
// rounding): row i is w's row rows[i], or r0 + i when rows is null; rows outside [0, out) give zeros.
// Either layout.
void launch_qdequant_rows(const QWeightArgs& w, const int32_t* rows, int64_t r0, int64_t n_rows, void* dst, Dt dt,
                          cudaStream_t s);

// Tokens up to which the quantized GEMV runs rather than dequantize + cuBLASLt: the tensor-core
// kernel costs about the same for 1..8 tokens per pass; the CUDA-core kernel's cost grows with the
// tokens (measured on the H200: 8 tokens ran at 6% of the copy rate), so it takes single tokens only.
inline int64_t qgemv_max_tokens(int bits) { return bits == 4 ? 16 : 1; }

}  // namespace kiln::backend::cuda
