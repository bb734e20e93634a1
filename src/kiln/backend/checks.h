// Argument checks that the CPU and the CUDA backend share: shapes, sizes and the dtype relations an
// op needs on every backend, each failing as "[who] <op>: ..." (who: the backend's name). What only
// one backend needs (f32 on the CPU, device residency and supported sizes on CUDA) stays with it.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "kiln/backend/backend.h"

namespace kiln::backend::checks {

// A tensor argument and its name in messages: each(check, op, {{x, "x"}, {y, "y"}}) runs a backend's
// own per-tensor check, check(t, op, name), on every argument in order.
struct Arg {
  const Tensor& t;
  const char* name;
};
using ArgCheck = void (*)(const Tensor& t, const char* op, const char* name);
inline void each(ArgCheck check, const char* op, std::initializer_list<Arg> args) {
  for (const Arg& a : args) check(a.t, op, a.name);
}

// A quantized weight's tensors (MLX layout): 2-D uint32 codes of whole `bits`-bit values, a group
// size dividing the input dimension, scales and biases [out, in / group_size] of one dtype.
// `op` prefixes the message where not null.
void quantized_weight(const char* who, const char* op, const Weight& w);
// A dense weight or table: a 2-D float tensor ("<op>: <what> must be a 2-D float tensor").
void float_matrix(const char* who, const char* op, const char* what, const Tensor& t);
// matmul: x [n, in] against a weight of `in` inputs and `out` outputs (`wshape` names it), y [n, out]
// not aliasing x, a bias of `out` values where present.
void matmul(const char* who, const Tensor& x, const Shape& wshape, int64_t in, int64_t out, const Tensor& bias,
            const Tensor& y);
// embedding: out [n, dim] for n ids.
void embedding_out(const char* who, const Tensor& out, int64_t n, int64_t dim);
// rms_norm: a weight of x's row length, y of x's size and dtype.
void rms_norm(const char* who, const Tensor& x, const Tensor& w, const Tensor& y);
// rope: x [n_tokens, n_heads, head_dim], a position per token, the rotary dim within head_dim.
void rope(const char* who, const Tensor& x, const Tensor& pos, const Tensor& inv_freq);
// A KV cache tensor (KvTensor, backend.h) of rows of `width` values: float rows of `float_dtype`, or
// quantized planes of matching shapes and dtypes (u32 codes, f16 scales/biases, the same rows).
// Returns its rows (n_blocks * block_size).
int64_t kv_tensor(const char* who, const char* op, const KvTensor& t, int64_t width, DType float_dtype);
// A backend path that covers float caches only: the cache's rows, or [who] naming the op when it
// is quantized.
const Tensor& float_kv(const char* who, const char* op, const KvTensor& t);
// kv_write: k, v [n, width] of one dtype; both caches of the same layout with rows of width.
void kv_write(const char* who, const Tensor& k, const Tensor& v, const Tensor& slots, const KvTensor& k_cache,
              const KvTensor& v_cache);
// attention: params of whole GQA groups, q / out / caches / block tables of the sizes they imply.
void attention(const char* who, const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache,
               const Tensor& block_tables, const Tensor& token_seq, const Tensor& token_pos, const AttnParams& p,
               const Tensor& out);
// Elementwise ops of one size and dtype: gated_act (gate, up, out), add (a, b, y).
void gated_act(const char* who, const Tensor& gate, const Tensor& up, const Tensor& out);
void add(const char* who, const Tensor& a, const Tensor& b, const Tensor& y);
void softcap(const char* who, float cap);
void gather_rows(const char* who, const Tensor& x, const Tensor& rows, const Tensor& out);
void scatter_rows(const char* who, const Tensor& src, const Tensor& rows, const Tensor& dst);
void copy(const char* who, const Tensor& src, const Tensor& dst);

}  // namespace kiln::backend::checks
