// The CPU backend: f32 activations, f32/bf16/f16 weights read in place (from the mmap), threads
// from ThreadPool::global(), inner loops from a Kernels table chosen once at creation.
// The ops' shared drivers (matmul, attention) are free functions so tests and benches can reach them.
#pragma once
#include <memory>

#include "kiln/backend/backend.h"
#include "kiln/backend/cpu/kernels.h"
#include "kiln/base/thread_pool.h"

namespace kiln::backend::cpu {

// y [n, out] = x [n, in] · wᵀ (+ bias). Decode-sized n streams the weight once (GEMV over output
// rows, split over threads); n >= kGemmMinTokens packs weight tiles into f32 panels (blocked GEMM).
constexpr int64_t kGemmMinTokens = 12;
void matmul(const Kernels& k, ThreadPool& pool, const Tensor& x, const Weight& w, Tensor& y);
// The kernels' view of a quantized Weight (matmul.cpp); throws [cpu] when its tensors disagree in shape.
QMatrix qmatrix_of(const Weight& w);

// Paged attention with the semantics of Backend::attention (backend.h).
void attention(const Kernels& k, ThreadPool& pool, const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache,
               const Tensor& block_tables, const Tensor& token_seq, const Tensor& token_pos, const AttnParams& p,
               Tensor& out);

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(SimdLevel level);
  SimdLevel simd_level() const { return k_.level; }

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }
  DType act_dtype() const override { return DType::f32; }

  Tensor alloc(DType t, Shape s) override;
  Tensor upload(const Tensor& host) override;
  Tensor to_host(const Tensor& t) override;
  Tensor to_host_async(const Tensor& t) override;
  std::function<void()> fence() override { return [] {}; }
  void copy(const Tensor& src, Tensor& dst) override;
  void fill_zero(Tensor& t) override;

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
  void scatter_add_rows(const Tensor& src, const Tensor& rows, const Tensor& weights, Tensor& dst) override;  // moe_ops.cpp

 private:
  const Kernels& k_;
  ThreadPool& pool_;
};

// A CPU backend at an explicit SIMD level (throws [cpu] when unsupported here).
std::unique_ptr<CpuBackend> make_cpu_backend_at(SimdLevel level);

}  // namespace kiln::backend::cpu
