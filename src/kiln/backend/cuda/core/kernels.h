// Launchers of the CUDA backend's kernels: plain C++ signatures (raw device pointers, sizes, a
// stream) so that cuda_backend.cpp, compiled by the host compiler, validates and dispatches while
// the .cu files hold only device code. All launchers are asynchronous on `stream`; shapes are
// checked by the caller. Dt names the element type of a float buffer.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::backend::cuda {

enum class Dt : int { f32 = 0, f16 = 1, bf16 = 2 };

// The 4-bit GEMV's quantized activations ("qx", qmatmul.cu): for x [n, in] and the weights' group
// size, codes [n][units][64 bytes] then meta [n_pad / 8][groups][8 tokens] of float2 (units =
// 4 ceil(in / 128), groups = 32 units / group_size).
struct QxLayout {
  int64_t n, n_pad, units, groups, code_bytes, meta_bytes;
};
inline QxLayout qx_layout(int64_t n, int64_t in, int group_size) {
  QxLayout L;
  L.n = n;
  L.n_pad = (n + 7) / 8 * 8;
  L.units = (in + 127) / 128 * 4;
  L.groups = L.units * 32 / group_size;
  L.code_bytes = n * L.units * 64;
  L.meta_bytes = L.n_pad * L.groups * 8;
  return L;
}
// Byte ranges of weights that a later kernel of the step streams (the next GEMV's), for `blocks`
// extra blocks of an earlier short kernel (add_rms_norm, gated_act) to prefetch into L2 while DRAM
// would otherwise idle (n = 0: none; l2_prefetch in common.cuh). A hint only: any ranges are correct.
struct L2Prefetch {
  static constexpr int kMax = 8;
  const char* p[kMax] = {};
  int64_t bytes[kMax] = {};
  int n = 0, blocks = 0;
};

// Where a producer kernel (rms_norm, add_rms_norm, gated_act) also writes the qx of its bf16 output
// (base null: it does not): code_bytes + meta_bytes at a 16-byte aligned base.
struct QxOut {
  void* base = nullptr;
  QxLayout L{};
  int group_size = 0;
};

// out[t, :] = table[ids[t], :] (ids outside [0, vocab) give a zero row); table [vocab, dim].
void launch_embedding(const void* table, Dt tt, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n, void* out,
                      Dt ot, cudaStream_t s);
// y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * (w or 1 + w), f32 math, one rounding; y may be x.
// With qx.base set (y bf16), y's qx too.
void launch_rms_norm(const void* x, Dt xt, const void* w, Dt wt, float eps, bool one_plus_w, int64_t rows, int64_t dim,
                     void* y, Dt yt, cudaStream_t s, const QxOut& qx = {});
// In-place rotate_half RoPE of x [n, heads, head_dim] over the first 2*half dims.
void launch_rope(void* x, Dt xt, int64_t n, int64_t heads, int64_t head_dim, const int32_t* pos, const float* inv_freq,
                 int64_t half, float attn_factor, cudaStream_t s);
// A quantized KV cache's planes on the device (KvTensor, backend.h): codes (8-bit: a byte per
// value; 4-bit: two, the lower nibble first) and f16 scales/biases, one per group of `group` values.
struct KvQuantPlanes {
  void* codes;
  void* scales;
  void* biases;
};
// The rows of k, v [n, width] (dtype kt) quantized into the caches at slots[t] in [0, n_slots)
// (negative: skipped) with kv_quant_rule.h's rule, as the CPU's quantize_kv_row: per group its
// min/max, scale and bias rounded to f16, codes against those. width % group == 0.
void launch_kv_write_quant(const void* k, const void* v, Dt kt, int64_t n, int64_t width, const int32_t* slots,
                           int64_t n_slots, const KvQuantPlanes& kc, const KvQuantPlanes& vc, int bits, int group,
                           cudaStream_t s);
// caches[slots[t], :] = k[t, :] / v[t, :] for slots[t] in [0, n_slots) (negative: skipped).
void launch_kv_write(const void* k, const void* v, Dt kt, int64_t n, int64_t width, const int32_t* slots,
                     int64_t n_slots, void* k_cache, void* v_cache, Dt ct, cudaStream_t s);
// out = act(gate) * up elementwise (act: 0 silu, 1 gelu_tanh, 2 gelu erf) over n values; with
// qx.base set (bf16, n = qx.L.n rows of cols), out's qx too.
void launch_gated_act(const void* gate, const void* up, int act, int64_t n, void* out, Dt t, cudaStream_t s,
                      int64_t cols = 0, const QxOut& qx = {}, const L2Prefetch& pf = L2Prefetch());
void launch_add(const void* a, const void* b, void* y, int64_t n, Dt t, cudaStream_t s);
void launch_scale(void* x, int64_t n, float s, Dt t, cudaStream_t st);
void launch_softcap(void* x, int64_t n, float cap, Dt t, cudaStream_t st);
// y[r, :] += bias[:] over rows of `cols`.
void launch_add_bias(void* y, Dt yt, int64_t rows, int64_t cols, const void* bias, Dt bt, cudaStream_t s);
// out[i] = x[rows[i]] (row_bytes each); rows outside [0, n_rows) give zero rows.
// dst[rows[i]] = src[i], rows of row_bytes (rows outside [0, n_rows) are skipped).
void launch_scatter_rows(const void* src, int64_t row_bytes, const int32_t* rows, int64_t n_src, int64_t n_rows, void* dst,
                         cudaStream_t s);
void launch_gather_rows(const void* x, int64_t row_bytes, const int32_t* rows, int64_t n_out, int64_t n_rows, void* out,
                        cudaStream_t s);
// dst[rows[i]] += weights[i] * src[i] in order of i (rows may repeat); parallel over columns.
void launch_scatter_add_rows(const void* src, const int32_t* rows, const float* weights, int64_t m, int64_t d,
                             int64_t n, void* dst, Dt t, cudaStream_t s);
// ids[r] = first index of the maximum of x[r, :]. Few rows split each row over argmax_splits blocks,
// whose partials go to scratch (argmax_scratch_bytes; may be null when that is 0).
int argmax_splits(int64_t rows, int64_t n);
inline size_t argmax_scratch_bytes(int64_t rows, int64_t n) {
  const int s = argmax_splits(rows, n);
  return s > 1 ? static_cast<size_t>(rows) * s * 8 : 0;
}
void launch_argmax_rows(const void* x, Dt t, int64_t rows, int64_t n, int32_t* ids, void* scratch, cudaStream_t s);
// dst = src converted elementwise.
void launch_convert(const void* src, Dt st, void* dst, Dt dt, int64_t n, cudaStream_t s);

// y [n, out] = x [n, in] · w [out, in]ᵀ (+ bias [out]): weight-streaming GEMV for few tokens (any
// weight dtype; 16-byte loads when rows are 16-byte aligned), f32 accumulation, one rounding.
void launch_gemv(const void* x, Dt xt, int64_t n, int64_t in, const void* w, Dt wt, int64_t out, const void* bias,
                 Dt bt, void* y, Dt yt, cudaStream_t s);
constexpr int64_t kGemvMaxTokens = 8;  // tokens per weight pass; more go in further passes
// gemv_fast.cu: the batch-1 bf16 GEMV with 256 B of loads in flight per lane, used by launch_gemv
// for every case gemv_fast_supported(...) takes.
bool gemv_fast_supported(Dt xt, int64_t n, int64_t in, const void* w, Dt wt, const void* x);
void launch_gemv_fast(const void* x, int64_t in, const void* w, int64_t out, const void* bias, Dt bt, void* y, Dt yt,
                      cudaStream_t s);

// Paged attention over a ragged batch (semantics of Backend::attention). q, out [n, n_heads *
// head_dim] bf16; caches [n_blocks, block_size, n_kv_heads * head_dim] bf16, or quantized
// (kv_bits 8/4: k_cache/v_cache the codes, k_q/v_q's scales and biases; kv_read.cuh reads them).
// Quantized caches take their own decode kernel (attention_decode_quantized: lane-per-key codes;
// else the generic kernel; attention_decode_tiled is false) and the prefill kernel with
// dequantizing tile loads.
struct AttnArgs {
  const void* q;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;
  const int32_t* token_seq;
  const int32_t* token_pos;
  void* out;
  int n_tokens, n_seqs, n_heads, n_kv_heads, head_dim;
  float scale, softcap;
  int window, block_size, max_blocks;
  int sink;  // AttnParams::sink
  int kv_bits = 0, kv_group = 0;  // 0: bf16 caches
  const void *k_scales = nullptr, *k_biases = nullptr, *v_scales = nullptr, *v_biases = nullptr;
};
// Split-K decode kernel: one block per (token, kv head, split) scores its key range [lo + split *
// keys_per_split, +keys_per_split) for all heads of the GQA group (the tiled kernel: for a chunk of
// them, the plan's `chunks` per kv head); the splits are merged by a combine kernel or, with
// `counters` (tiled or quantized kernel, n_splits <= kAttnFusedMaxSplits), by the last block of each
// (token, kv head chunk) to finish: counters is [n_tokens][n_kv_heads * chunks] zeros, left zero.
// `n_splits` > 1 needs `partials` (f32, attention_partials_floats(...) of them). Works for any shape
// (group <= 16, head_dim <= 256). attention_decode_tiled(a): the fast tiled kernel runs (head_dim
// 64/128/256, 16-byte aligned caches), any keys_per_split; otherwise the generic kernel runs, which
// needs keys_per_split <= kAttnGenericMaxKeysPerSplit. qx.base (tiled kernel, one split or counters,
// attention_decode_qx_ok): out's qx (QxOut) is written too.
constexpr int kAttnGenericMaxKeysPerSplit = 1024;
constexpr int kAttnFusedMaxSplits = 64;
bool attention_decode_tiled(const AttnArgs& a);
// A quantized cache of head_dim 64/128, GQA group <= 8 and groups of 32+ values takes the
// quantized tiled kernel (any keys_per_split); other quantized caches the generic kernel.
bool attention_decode_quantized(const AttnArgs& a);
bool attention_decode_qx_ok(const AttnArgs& a, int chunks, int group_size);
int64_t attention_partials_floats(const AttnArgs& a, int n_splits);
// The split-K plan of a decode launch, from host-known sizes only (a graph replays the same choice):
// max_keys bounds the keys any token sees. latency: the tiled kernel's latency form (grids of at most
// one block per SM; attention_decode.cu says how the plan is chosen). chunks: the tiled kernel's
// blocks per (token, kv head, split), each a near-equal chunk of the GQA group's query heads.
struct AttnDecodePlan {
  int n_splits, keys_per_split;
  bool latency;
  int chunks;
};
AttnDecodePlan attention_decode_plan(const AttnArgs& a, int64_t max_keys, int n_sms);
void launch_attention_decode(const AttnArgs& a, const AttnDecodePlan& plan, float* partials, unsigned* counters,
                             const QxOut& qx, cudaStream_t s);
// Tensor-core (mma.sync bf16) flash-attention kernel: blocks of 128 query rows (tokens x the heads
// of a GQA group, which share each K/V tile), K/V double-buffered by cp.async; any batch (tiles
// mixing sequences take one pass per sequence). head_dim must satisfy attention_prefill_supported();
// q, caches and out 16-byte aligned (device allocations are).
bool attention_prefill_supported(int head_dim);
void launch_attention_prefill(const AttnArgs& a, cudaStream_t s);

}  // namespace kiln::backend::cuda

// ---- fused ops (fused.cu, gemv_fast.cu): one launch where a decode step had several; each
// gives exactly the values of the kernels it replaces (shared device helpers, row_ops.cuh).
namespace kiln::backend::cuda {

// x[r] = x[r] + delta[r] (rounded to xt), then y[r] = rms_norm(x[r]) as launch_rms_norm computes
// it from the stored x; x, delta, y [rows, dim] of dtype xt (y may alias x or delta). With qx.base
// set (bf16), y's qx too.
void launch_add_rms_norm(void* x, const void* delta, Dt xt, const void* w, Dt wt, float eps, bool one_plus_w,
                         int64_t rows, int64_t dim, void* y, cudaStream_t s, const QxOut& qx = {},
                         const L2Prefetch& pf = L2Prefetch());

// launch_rope on q [n, n_heads, head_dim] and k [n, n_kv_heads, head_dim] (in place), then
// launch_kv_write of the rotated k and v [n, n_kv_heads * head_dim] into the caches
// [n_slots, n_kv_heads * head_dim] (slots outside [0, n_slots) skipped). All of one dtype.
struct RopeKvArgs {
  void* q;
  void* k;
  const void* v;
  const int32_t* pos;      // [n_tokens]
  const float* inv_freq;   // [half]
  const int32_t* slots;    // [n_tokens]
  void* k_cache;
  void* v_cache;
  int64_t n_tokens, n_heads, n_kv_heads, head_dim, half, n_slots;
  float attn_factor;
};
void launch_rope_kv_write(const RopeKvArgs& a, Dt t, cudaStream_t s);

// Several batch-1 bf16 GEMVs sharing x [1, in] in one launch (q/k/v, gate/up): y_i [out_i] =
// x · w_iᵀ (+ bias_i) by gemv_fast's kernel body, so each equals launch_gemv_fast(x, in, w_i, ...).
// Every w_i must pass gemv_fast_supported. Blocks map to (matrix, rows) by prefix sums of blocks.
struct GemvFastMulti {
  static constexpr int kMax = 4;
  int count = 0;
  const void* w[kMax] = {};
  int64_t out[kMax] = {};
  const void* bias[kMax] = {};  // nullptr: none
  Dt bias_t[kMax] = {};
  void* y[kMax] = {};
  Dt y_t[kMax] = {};
};
void launch_gemv_fast_multi(const void* x, int64_t in, const GemvFastMulti& m, cudaStream_t s);

}  // namespace kiln::backend::cuda

// ---- MoE on the device (moe.cu): routing and the experts' gated MLPs for decode-sized batches,
// reading the chosen expert ids from device memory (no host round trip; graph-capturable).
namespace kiln::backend::cuda {

// Router (semantics of Backend::moe_route, f32 math): per token, softmax of logits [n, E], the
// top_k by logit (= by probability; ties to the lower index), best first, into ids/weights [n, k].
constexpr int64_t kMoeRouteMaxExperts = 8192;  // the logits row lives in shared memory
void launch_moe_route(const void* logits, Dt lt, int64_t n, int64_t n_experts, int top_k, bool norm_topk_prob,
                      int32_t* ids, float* weights, cudaStream_t s);

// Experts (semantics of Backend::moe_experts): for each pair p = (t, j) of the n * k, expert
// e = ids[p] (outside [0, E): the pair adds nothing) gives h[p] = act(x[t]·gate_eᵀ) * (x[t]·up_eᵀ)
// and y[p] = h[p]·down_eᵀ (bf16 scratch, rounded where the default's bf16 tensors round), then
// out[t] = Σ weights[p] * y[p] over t's pairs in increasing e, rounding to out's dtype at each add
// (as scatter_add_rows). gate/up/down: device tables of E weight pointers, [ffn, dim] / [dim, ffn].
struct MoeExpertsArgs {
  const void* x;  // [n, dim] of xt
  Dt xt;
  const void* const* gate;  // [E] device pointers
  const void* const* up;
  const void* const* down;
  Dt wt;
  const int32_t* ids;   // [n, k]
  const float* weights; // [n, k]
  int64_t n, k, n_experts, dim, ffn;
  int act;         // 0 silu, 1 gelu_tanh, 2 gelu erf (as launch_gated_act)
  bool vector;     // 16-byte weight loads: every row of every expert (and x, h) aligned for them
  void* h;         // scratch [n * k, ffn] bf16
  void* y;         // scratch [n * k, dim] bf16
  void* out;       // [n, dim] of ot
  Dt ot;
};
void launch_moe_experts(const MoeExpertsArgs& a, cudaStream_t s);


}  // namespace kiln::backend::cuda
