// The Backend interface: device buffers plus the narrow op set every model is written against.
// The CPU backend is the reference; CUDA is tested op by op against it. An op a backend lacks
// throws by name. All activation tensors are row-major; shapes are given per argument.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::backend {

// A linear layer's weight: dense [out, in] (f32/bf16/f16), or (later) packed affine-quantized
// with scales/biases [out, in/group_size]. Bias [out] is optional.
struct Weight {
  Tensor w;
  Tensor scales, biases;  // empty when dense
  int bits = 0, group_size = 0;
  Tensor bias;            // empty when absent
  bool quantized() const { return bits != 0; }
  int64_t out_features() const { return w.dim(0); }
  int64_t in_features() const { return quantized() ? w.dim(1) * 32 / bits : w.dim(1); }
};

// Attention over the paged KV cache for a ragged batch. Token t belongs to sequence
// token_seq[t] at absolute position token_pos[t]; it attends to that sequence's cached keys at
// positions j with j <= token_pos[t] (causal) and, when window > 0, j > token_pos[t] - window;
// with sink > 0 (and a window) also at j < sink: the rotating cache (mlx-lm's RotatingKVCache) keeps
// the first `sink` keys besides the window. A block holding no key visible to a sequence's tokens
// is not used (its block-table entry may name any block of the cache). Key j of sequence s lives in block block_tables[s * max_blocks + j / block_size], row j % block_size.
struct AttnParams {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;    // multiplies q·k
  float softcap = 0.0f;  // > 0: scores = softcap * tanh(scores / softcap)
  int window = 0;        // sliding window in tokens, 0 = full
  int sink = 0;          // with window > 0: keys j < sink stay visible too (0 = none)
  int block_size = 0;
  int max_blocks = 0;    // row stride of block_tables
};

// The KV cache's quantization (--kv-bits, --kv-group-size): bits 0 = float rows in the activation
// dtype; 8 or 4 = affine codes per group of group_size values along each head's head_dim (the group
// divides head_dim, so no group straddles two heads): kv_quant.h's rule, mlx's code packing.
struct KvQuant {
  int bits = 0, group_size = 0;
  bool on() const { return bits != 0; }
  bool operator==(const KvQuant&) const = default;
};

// One layer's K (or V) cache, width = n_kv_heads * head_dim values per token:
//   float:     data [n_blocks, block_size, width] in the activation dtype; scales, biases empty.
//   quantized: data u32 [n_blocks, block_size, width * bits / 32] (each row an LSB-first bit stream
//              of width codes, as mlx's quantize packs it: 8-bit = one code a byte, 4-bit = two, the
//              lower nibble first), scales and biases f16 [n_blocks, block_size, width / group_size];
//              value = code * scale + bias, computed in f32.
// The ops take it by const reference (the handles stay, the rows they point at are written); a
// plain Tensor converts to a float one.
struct KvTensor {
  Tensor data, scales, biases;
  KvQuant quant;
  KvTensor() = default;
  KvTensor(const Tensor& t) : data(t) {}  // NOLINT: a float cache
  bool quantized() const { return quant.on(); }
  int64_t n_rows() const { return data.rows(); }  // n_blocks * block_size
};

enum class Activation { silu, gelu_tanh, gelu };

// One layer of a Llama-style pre-norm decoder, by reference (FusedDecoder::run): the weights stay
// owned by the model, the caches by the KV cache.
struct DecoderLayerRef {
  const Tensor* attn_norm = nullptr;  // [dim]
  const Tensor* mlp_norm = nullptr;
  const Weight *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  const Weight *gate = nullptr, *up = nullptr, *down = nullptr;
  KvTensor* k_cache = nullptr;  // float: [n_blocks, block_size, n_kv_heads * head_dim]
  KvTensor* v_cache = nullptr;  // (a fused decoder declines quantized caches it does not cover)
  int window = 0;  // sliding window in tokens, 0 = full
  int sink = 0;    // keys kept before the window (AttnParams::sink); the CUDA fused decoder has none
};
struct DecoderStackArgs {
  std::span<const DecoderLayerRef> layers;
  AttnParams attn;  // heads, head_dim, scale, softcap, block_size, max_blocks (window: per layer)
  Activation act = Activation::silu;
  float eps = 1e-5f;
  Tensor inv_freq;  // f32 [head_dim / 2]
  float attn_factor = 1.0f;
  Tensor positions, slots, block_tables, token_seq;  // the step's inputs (one token)
};

// An optional device fast path (Backend::fused_decoder; CUDA: the persistent 4-bit decoder kernel):
// every layer of a one-token decode step in one go. x [1, dim], the residual after the embedding,
// becomes the residual after the last layer (its MLP output added). Per layer: x += o(attention(
// rope_kv_write(q, k, v of rms_norm(x, attn_norm)))), then x += gated_mlp(rms_norm(x, mlp_norm)) —
// the values of those ops up to summation order. run() returns false (nothing done) for layers or
// shapes it does not cover; the model then runs the layers op by op.
class FusedDecoder {
 public:
  virtual ~FusedDecoder() = default;
  virtual bool run(const DecoderStackArgs& a, Tensor& x) = 0;
};

// What a backend is good at, as data (the engine and the runner read it; nothing tests the device).
struct Caps {
  // Decode steps replay as device graphs keyed by the batch's shape: the runner pads decode batches
  // to a few buckets and block tables to powers of two so that few graphs are captured.
  bool graphs = false;
  // Logits live off the host: greedy ids (argmax_rows) and sampled ids (sample_rows) computed where
  // the logits are save a [rows, vocab] download.
  bool device_sampling = false;
};

// One MoE expert's gated MLP, by reference (the weights stay owned by the model):
// y = down(act(gate(x)) * up(x)); gate/up [ffn, dim], down [dim, ffn].
struct ExpertWeights {
  const Weight* gate = nullptr;
  const Weight* up = nullptr;
  const Weight* down = nullptr;
};

// One row's sampling parameters for Backend::sample_rows: the engine's SamplingParams, flattened.
struct SampleParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax of the adjusted logits)
  float top_p = 1.0f, min_p = 0.0f;
  int top_k = 0;             // 0: off
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  double uniform = 0.0;      // the row's draw in [0, 1), from its sequence's own generator
};
// One token of one row whose logit changes before sampling (at most one entry per (row, token)):
// + bias, then the repetition penalty when in_context, then - (presence + frequency * n_generated)
// when n_generated > 0 — the order of the host Sampler's apply_penalties.
struct LogitAdjust {
  int32_t row = 0, token = 0;
  float bias = 0.0f;
  int32_t in_context = 0, n_generated = 0;
};

// Token masks for Backend::sample_rows (structured output's grammar masks): row rows[i] keeps only
// the tokens whose bit is set in words[i * n_words, (i + 1) * n_words) (token t: word t / 32, bit
// t % 32; n_words >= ceil(vocab / 32)); the others become -inf before the adjustments. Rows not
// listed are not masked.
struct TokenMasks {
  std::vector<int32_t> rows;
  std::vector<uint32_t> words;
  int64_t n_words = 0;
  bool empty() const { return rows.empty(); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // The dtype activations are computed in (f32 on the CPU, bf16 on CUDA).
  virtual DType act_dtype() const = 0;
  virtual Caps caps() const { return {}; }
  // The backend's fused decoder fast path, or null where it has none (the CPU).
  virtual FusedDecoder* fused_decoder() { return nullptr; }

  // ---- buffers
  virtual Tensor alloc(DType t, Shape s) = 0;                // uninitialized device memory
  virtual Tensor upload(const Tensor& host) = 0;             // host -> device copy (CPU: may alias)
  virtual Tensor to_host(const Tensor& t) = 0;               // device -> host copy (CPU: may alias)
  // A device -> host copy that runs behind the work queued after it: the result holds the bytes once
  // the waiter of a later fence() returns (CPU: a copy made now, never an alias).
  virtual Tensor to_host_async(const Tensor& t) = 0;
  // A waiter for everything queued so far, callable from any thread (CPU: returns at once).
  virtual std::function<void()> fence() = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;     // same dtype and numel, device to device
  virtual void fill_zero(Tensor& t) = 0;
  virtual void synchronize() {}

  // ---- step hooks (no-ops on the CPU; the CUDA backend uses them so that a decode step
  // allocates no device memory and replays as one CUDA graph).
  // Between begin_step() and end_step(), alloc() hands out per-step buffers from a reusable arena
  // (freed when the last Tensor holding them goes); outside a step alloc() is a plain allocation
  // (KV cache, weights). Use StepScope rather than calling these directly.
  virtual void begin_step() {}
  virtual void end_step() {}
  // Ops issued between begin_graph(key) and end_graph() are recorded as a graph the second time a
  // key is seen and replayed on later steps with that key (the ops' host calls then launch
  // nothing). The key must name everything that changes the op sequence or its shapes; inputs
  // read from device buffers (token ids, positions, block tables) may change freely, since the same
  // allocation sequence puts them at the same addresses. Returns whether graphs are in use.
  virtual bool begin_graph(uint64_t key) { return false; }
  virtual void end_graph() {}
  // A weight (host tensor, e.g. from the mmap) that ops will be given: the CUDA backend copies it
  // to device memory once, here at load rather than at first use. No-op on the CPU.
  virtual void prefetch_weight(const Tensor& host) {}

  // ---- ops. x, y are [n_tokens, features] in act_dtype unless said.
  // out[t] = table[ids[t]] (table [vocab, dim] any float dtype or quantized; ids i32 [n]).
  virtual void embedding(const Weight& table, const Tensor& ids, Tensor& out) = 0;
  // y = x · wᵀ (+ bias): x [n, in], w [out, in], y [n, out].
  virtual void matmul(const Tensor& x, const Weight& w, Tensor& y) = 0;
  // y = x / rms(x) * (w or 1 + w) over the last dim; x, y [rows, dim] (y may be x); w [dim].
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, bool one_plus_w, Tensor& y) = 0;
  // Rotates x [n_tokens, n_heads, head_dim] in place by position pos[t] (i32 [n_tokens]), in HF's
  // "rotate_half" layout over the first 2*inv_freq.numel() dims: angle_i = pos * inv_freq[i];
  // cos/sin are multiplied by attn_factor (yarn). inv_freq f32 [rotary_dim / 2].
  virtual void rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, float attn_factor) = 0;
  // Writes k, v [n_tokens, n_kv_heads * head_dim] into the caches (KvTensor: float [n_blocks,
  // block_size, n_kv_heads * head_dim], or quantized: each row quantized once, here, group by group
  // with kv_quant.h's rule, as quantize_kv_row) at rows slots[t] (i32 [n_tokens],
  // block * block_size + offset; < 0: skipped).
  virtual void kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, const KvTensor& k_cache,
                        const KvTensor& v_cache) = 0;
  // out [n_tokens, n_heads * head_dim] = softmax(q·Kᵀ * scale (softcapped, masked)) · V.
  // q [n_tokens, n_heads * head_dim]; token_seq, token_pos i32 [n_tokens];
  // block_tables i32 [n_seqs * max_blocks]. GQA: head h reads kv head h / (n_heads / n_kv_heads).
  // Quantized caches are read as they are: each key/value row dequantized on the fly (the same f32
  // values dequantize_kv_row gives), never a dequantized copy of the cache.
  virtual void attention(const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache, const Tensor& block_tables,
                         const Tensor& token_seq, const Tensor& token_pos, const AttnParams& p, Tensor& out) = 0;
  // out = act(gate) * up; gate, up, out [n, ffn] (out may alias gate).
  virtual void gated_act(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) = 0;
  // y = a + b elementwise (y may alias a or b).
  virtual void add(const Tensor& a, const Tensor& b, Tensor& y) = 0;
  // x *= s elementwise, in place.
  virtual void scale(Tensor& x, float s) = 0;
  // x = cap * tanh(x / cap), in place.
  virtual void softcap(Tensor& x, float cap) = 0;
  // out[i] = x[rows[i]]: rows i32 [n_out], x [n, d], out [n_out, d].
  virtual void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) = 0;
  // dst[rows[i]] = src[i]: rows i32 [n_src] (distinct), src [n_src, d], dst [n, d], any dtype (byte
  // copies; gather_rows' inverse). Moves KV blocks between the cache and a staging buffer.
  virtual void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) = 0;
  // dst[rows[i]] += weights[i] * src[i] for i in order (rows may repeat): src [m, d] act dtype,
  // rows i32 [m], weights f32 [m], dst [n, d]. Combines MoE expert outputs.
  virtual void scatter_add_rows(const Tensor& src, const Tensor& rows, const Tensor& weights, Tensor& dst) = 0;

  // ---- fused ops: one launch where a decode step had several. Each has a default made of the ops
  // above (backend_defaults.cpp), which is the reference semantics (the CPU backend inherits it);
  // a backend overrides one only with a result equal to that sequence (CUDA: fused kernels).
  // x = x + delta (rounded to x's dtype), then y = rms_norm(x) of the stored x: the residual add
  // followed by the next block's norm. x, delta, y [rows, dim] (y may alias delta; w [dim]).
  virtual void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, bool one_plus_w, Tensor& y);
  // rope(q), rope(k) (q [n_tokens, n_heads, head_dim], k [n_tokens, n_kv_heads, head_dim], both in
  // place, as rope()), then kv_write(k, v, slots, k_cache, v_cache) of the rotated k (v [n_tokens,
  // n_kv_heads * head_dim]).
  virtual void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& inv_freq,
                             float attn_factor, const Tensor& slots, const KvTensor& k_cache,
                             const KvTensor& v_cache);
  // y[i] = x · w[i]ᵀ (+ bias[i]) for up to kMaxMultiMatmul weights sharing the input x [n, in]
  // (q/k/v, gate/up); y[i] [n, out_i]; w.size() == y.size(). Same result as matmul() per pair.
  static constexpr size_t kMaxMultiMatmul = 4;
  virtual void matmul_multi(const Tensor& x, std::span<const Weight* const> w, std::span<Tensor* const> y);
  // out [n, dim] = down(act(gate(x)) * up(x)) for x [n, dim]: matmul_multi gate/up into act-dtype
  // [n, ffn] buffers, gated_act into the gate buffer, matmul down (gate/up [ffn, dim], down [dim, ffn]).
  virtual void gated_mlp(const Tensor& x, const Weight& gate, const Weight& up, const Weight& down, Activation act,
                         Tensor& out);
  // ---- MoE (qwen3_moe, mixtral). The defaults are the host routing of the reference (they read
  // the router logits / expert ids back to the host); CUDA keeps decode-sized batches on the device.
  // Router: per token t, p = softmax(logits[t]) over the E experts (f32 or better), the top_k
  // experts by p (ties to the lower index) in descending order: ids[t, j] (i32 [n, top_k]) and
  // weights[t, j] = p (or p / the sum of the top_k p when norm_topk_prob; f32 [n, top_k]).
  // logits [n, E] any float dtype.
  virtual void moe_route(const Tensor& logits, int top_k, bool norm_topk_prob, Tensor& ids, Tensor& weights);
  // out [n, dim] = sum over slots j of weights[t, j] * expert ids[t, j] (x[t]), experts applied in
  // increasing expert index (the order of the default, which runs each expert once over its gathered
  // tokens: gather_rows, gated_mlp, scatter_add_rows). x [n, dim]
  // act dtype; ids i32 [n, k] in [0, experts.size()); weights f32 [n, k]; out may not alias x.
  virtual void moe_experts(const Tensor& x, std::span<const ExpertWeights> experts, Activation act, const Tensor& ids,
                           const Tensor& weights, Tensor& out);
  // Whether moe_route + moe_experts run for n_tokens with these experts without reading anything
  // back to the host (so a step using them can be captured as a graph). False by default.
  virtual bool moe_on_device(std::span<const ExpertWeights> experts, int64_t n_tokens) const { return false; }

  // ids[i] = argmax_j x[i, j] (first on ties): x [rows, n] f32 or act dtype, ids i32 [rows].
  // Greedy sampling on the device, so only the ids leave it.
  virtual void argmax_rows(const Tensor& x, Tensor& ids);
  // ids[r] = a token drawn from row r of logits (f32 [rows, vocab], adjusted in place by `adjust`)
  // under params[r]: the host Sampler's semantics (temperature, then top-k, min-p, top-p over the
  // tokens ranked by logit; greedy when temperature <= 0; sample_row in sampling.h is the reference
  // and the default here, on host-readable logits), so only the ids leave the device. `masks` are
  // applied first (the host path's logits processors run before the Sampler's adjustments too).
  virtual void sample_rows(Tensor& logits, const std::vector<SampleParams>& params,
                           const std::vector<LogitAdjust>& adjust, Tensor& ids, const TokenMasks& masks = {});
  // Free and total bytes of the device's memory; false for host backends (nothing to budget).
  virtual bool device_memory(size_t* free_bytes, size_t* total_bytes) const { return false; }
};

// begin_step()/end_step() for one forward pass, also when it throws.
class StepScope {
 public:
  explicit StepScope(Backend& be) : be_(be) { be_.begin_step(); }
  ~StepScope() { be_.end_step(); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  Backend& be_;
};

// The CPU backend (f32 compute; SIMD chosen at run time; threads from ThreadPool::global()).
std::unique_ptr<Backend> make_cpu_backend();
// The CUDA backend on GPU `device` (bf16 activations, f32 accumulation; cuBLASLt GEMMs, own
// kernels, CUDA graphs for decode). Throws [cuda] when this build has no CUDA or there is no GPU.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
// True when this build has the CUDA backend and a usable GPU is present (never throws).
bool cuda_device_available();

}  // namespace kiln::backend
