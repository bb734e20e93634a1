// The CUDA backend: bf16 activations with f32 accumulation (norms, softmax in f32), weights copied
// to the device once and found again by their host address, cuBLASLt for dense bf16 GEMMs, own
// kernels for everything else (kernels.h). Per-step buffers come from an arena (no cudaMalloc on
// the decode path once warm) and decode steps replay as CUDA graphs (Backend::begin_graph).
// Only this header is seen by host code and tests; CUDA types stay in the .cpp/.cu files.
#pragma once
#include <cstdint>
#include <memory>

#include "kiln/backend/backend.h"

namespace kiln::backend::cuda {

struct CudaStats {
  int64_t device_mallocs = 0;   // cudaMalloc calls (weights, caches, arena growth)
  int64_t arena_overflows = 0;  // per-step allocations that did not fit the arena
  int64_t graph_captures = 0, graph_replays = 0;
  int64_t arena_bytes = 0, weight_bytes = 0;
  int64_t fused_decoders = 0;  // launches of the 4-bit decoder stack (one token, every layer)
};

// Which attention kernel runs; auto picks the tensor-core prefill kernel when most tokens are
// prompt tokens and head_dim allows, else the split-K decode kernel. Tests force each.
enum class AttnKernel { automatic, decode, prefill };

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }
  DType act_dtype() const override { return DType::bf16; }
  Caps caps() const override { return {.graphs = true, .device_sampling = true}; }
  FusedDecoder* fused_decoder() override;

  Tensor alloc(DType t, Shape s) override;
  Tensor upload(const Tensor& host) override;
  Tensor to_host(const Tensor& t) override;
  Tensor to_host_async(const Tensor& t) override;
  std::function<void()> fence() override;
  void copy(const Tensor& src, Tensor& dst) override;
  void fill_zero(Tensor& t) override;
  void synchronize() override;

  void begin_step() override;
  void end_step() override;
  bool begin_graph(uint64_t key) override;
  void end_graph() override;
  void prefetch_weight(const Tensor& host) override;

  void embedding(const Weight& table, const Tensor& ids, Tensor& out) override;
  void matmul(const Tensor& x, const Weight& w, Tensor& y) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, bool one_plus_w, Tensor& y) override;
  void rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, float attn_factor) override;
  void kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, const KvTensor& k_cache,
                const KvTensor& v_cache) override;
  void attention(const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache, const Tensor& block_tables,
                 const Tensor& token_seq, const Tensor& token_pos, const AttnParams& p, Tensor& out) override;
  void gated_act(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& y) override;
  void scale(Tensor& x, float s) override;
  void softcap(Tensor& x, float cap) override;
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) override;
  void scatter_add_rows(const Tensor& src, const Tensor& rows, const Tensor& weights, Tensor& dst) override;
  void argmax_rows(const Tensor& x, Tensor& ids) override;
  // Fused ops (cuda_fused_ops.cpp; kernels in fused.cu and gemv_fast.cu): each one launch, with the
  // values of the op sequence it replaces. matmul_multi fuses batch-1 bf16 GEMVs only; other
  // cases (several tokens, quantized or non-bf16 weights) run Backend's loop of matmul.
  void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, bool one_plus_w, Tensor& y) override;
  void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& inv_freq,
                     float attn_factor, const Tensor& slots, const KvTensor& k_cache,
                     const KvTensor& v_cache) override;
  void matmul_multi(const Tensor& x, std::span<const Weight* const> w, std::span<Tensor* const> y) override;
  // One token through every layer in one persistent launch (cuda_qops.cpp, qdecoder.cu) when all
  // seven matrices of every layer are 4-bit of one group size and the shapes fit the kernel
  // (q4_decoder_fits), set_fused_decoder is on (the default) and this is the process's only
  // CudaBackend (a persistent kernel waits at grid barriers for all of its blocks). fused_decoder()
  // hands it out as the FusedDecoder hook.
  bool decoder_stack(const DecoderStackArgs& a, Tensor& x);
  // Device sampling (cuda_sampling.cpp, kernels in sampling.cu).
  void sample_rows(Tensor& logits, const std::vector<SampleParams>& params, const std::vector<LogitAdjust>& adjust,
                   Tensor& ids, const TokenMasks& masks = {}) override;
  bool device_memory(size_t* free_bytes, size_t* total_bytes) const override;
  // MoE (cuda_moe_ops.cpp, kernels in moe.cu): routing on the device (up to kMoeRouteMaxExperts
  // experts); the experts on the device for up to kMoeMaxTokens tokens when every expert is a dense
  // float gated MLP of one dtype and shape (then moe_on_device is true), else Backend's host default
  // (quantized experts, prefill). KILN_CUDA_MOE=0 always takes the default (A/B measurements).
  static constexpr int64_t kMoeMaxTokens = 16;
  void moe_route(const Tensor& logits, int top_k, bool norm_topk_prob, Tensor& ids, Tensor& weights) override;
  void moe_experts(const Tensor& x, std::span<const ExpertWeights> experts, Activation act, const Tensor& ids,
                   const Tensor& weights, Tensor& out) override;
  bool moe_on_device(std::span<const ExpertWeights> experts, int64_t n_tokens) const override;

  // Converts a device float tensor to another float dtype (tests; weights of other dtypes).
  Tensor convert(const Tensor& t, DType to);
  const CudaStats& stats() const;
  // Whether a 4-bit GEMV reading x now would take the quantized copy the op that produced x wrote
  // beside it (the activation cache, act_cache.cpp; tests).
  bool has_cached_qx(const Tensor& x) const;
  void set_attention_kernel(AttnKernel k);
  void set_graphs_enabled(bool on);
  // The 4-bit decoder stack (decoder_stack): on by default; KILN_CUDA_FUSED_DECODER=0 or this turns
  // it off (the separate ops, for comparisons).
  void set_fused_decoder(bool on);
  // KILN_CUDA_PROFILE=1: every op is timed with events (graphs off); report() prints a table.
  std::string profile_report() const;

  struct Impl;
  struct MoeCache;

 private:
  std::unique_ptr<Impl> impl_;
  // Per MoE layer: whether its experts take the device path, and their device pointer table
  // (built at first use). shared_ptr: its type is complete only in cuda_moe_ops.cpp.
  mutable std::shared_ptr<MoeCache> moe_;
  std::unique_ptr<FusedDecoder> fused_decoder_;  // made at first ask
};

}  // namespace kiln::backend::cuda
