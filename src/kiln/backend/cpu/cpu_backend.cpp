// CpuBackend: buffers (host memory; upload/to_host alias), the row-wise ops (embedding, RMSNorm,
// RoPE, KV writes, gated activations, elementwise) and the dispatch of matmul/attention to their
// drivers. Shapes are checked on entry: a mismatch throws "[cpu] <op>: ..." naming the argument.
#include "kiln/backend/cpu/cpu_backend.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/backend/checks.h"
#include "kiln/backend/kv_quant.h"

namespace kiln::backend::cpu {

namespace {

// Elementwise loops go parallel only above this many elements (below it, waking the workers
// costs more than the loop).
constexpr int64_t kElemChunk = 1 << 15;

void require_f32(const Tensor& t, const char* op, const char* arg) {
  if (t.dtype != DType::f32)
    fail("cpu", "{}: {} must be float32 on the CPU backend, got {}", op, arg, dtype_name(t.dtype));
}
void require_i32(const Tensor& t, const char* op, const char* arg) {
  if (t.dtype != DType::i32) fail("cpu", "{}: {} must be int32, got {}", op, arg, dtype_name(t.dtype));
}

float gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}
float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

CpuBackend::CpuBackend(SimdLevel level) : k_(kernels_for(level)), pool_(ThreadPool::global()) {}

std::unique_ptr<CpuBackend> make_cpu_backend_at(SimdLevel level) { return std::make_unique<CpuBackend>(level); }

// ---- buffers

Tensor CpuBackend::alloc(DType t, Shape s) { return Tensor::host(t, std::move(s)); }
Tensor CpuBackend::upload(const Tensor& host) { return host; }  // host memory is device memory here
Tensor CpuBackend::to_host(const Tensor& t) { return t; }

Tensor CpuBackend::to_host_async(const Tensor& t) {
  Tensor h = Tensor::host(t.dtype, t.shape);
  std::memcpy(h.data, t.data, t.nbytes());
  return h;
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  checks::copy("cpu", src, dst);
  if (src.data != dst.data) std::memmove(dst.data, src.data, src.nbytes());
}

void CpuBackend::fill_zero(Tensor& t) { std::memset(t.data, 0, t.nbytes()); }

// ---- ops

void CpuBackend::embedding(const Weight& table, const Tensor& ids, Tensor& out) {
  require_i32(ids, "embedding", "ids");
  require_f32(out, "embedding", "out");
  const Tensor& w = table.w;
  const bool quantized = table.quantized();  // then gather + dequantize: one packed row per token
  const QMatrix q = quantized ? qmatrix_of(table) : QMatrix{};
  if (!quantized) checks::float_matrix("cpu", "embedding", "table", w);
  const int64_t n = ids.numel(), vocab = quantized ? q.out : w.dim(0), dim = quantized ? q.in : w.dim(1);
  checks::embedding_out("cpu", out, n, dim);
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < n; ++t)
    if (id[t] < 0 || id[t] >= vocab) fail("cpu", "embedding: token id {} out of range [0, {})", id[t], vocab);
  const size_t row_bytes = dim * dtype_size(w.dtype);
  pool_.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* o = out.ptr<float>() + t * dim;
      if (quantized)
        k_.qdequant(q, id[t], 0, dim, o);
      else
        k_.to_f32(static_cast<const char*>(w.data) + id[t] * row_bytes, w.dtype, o, dim);
    }
  }, std::max<int64_t>(1, kElemChunk / std::max<int64_t>(1, dim)));
}

void CpuBackend::matmul(const Tensor& x, const Weight& w, Tensor& y) { cpu::matmul(k_, pool_, x, w, y); }

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, bool one_plus_w, Tensor& y) {
  checks::each(require_f32, "rms_norm", {{x, "x"}, {y, "y"}});
  const int64_t dim = x.cols(), rows = x.rows();
  checks::rms_norm("cpu", x, w, y);
  // w_eff [dim]: the weight in f32, with Gemma's 1 + w folded in (computed in f32 as HF does).
  std::vector<float> w_eff(dim);
  k_.to_f32(w.data, w.dtype, w_eff.data(), dim);
  if (one_plus_w)
    for (auto& v : w_eff) v = 1.0f + v;
  pool_.parallel_for(rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x.ptr<float>() + r * dim;
      float ms = k_.sum_sq(xr, dim) / static_cast<float>(dim);
      float inv = 1.0f / std::sqrt(ms + eps);
      k_.mul_scaled(xr, w_eff.data(), inv, y.ptr<float>() + r * dim, dim);
    }
  }, std::max<int64_t>(1, kElemChunk / std::max<int64_t>(1, dim)));
}

void CpuBackend::rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, float attn_factor) {
  require_f32(x, "rope", "x");
  require_i32(pos, "rope", "pos");
  checks::rope("cpu", x, pos, inv_freq);
  const int64_t n = x.dim(0), n_heads = x.dim(1), head_dim = x.dim(2), half = inv_freq.numel();
  const float* f = inv_freq.ptr<float>();
  pool_.parallel_for(n, [&](int64_t b, int64_t e) {
    std::vector<float> cs(half), sn(half);
    for (int64_t t = b; t < e; ++t) {
      // The angle is rounded to f32 as HF does (inv_freq f32 times position f32); cos/sin of it.
      const float p = static_cast<float>(pos.ptr<int32_t>()[t]);
      for (int64_t i = 0; i < half; ++i) {
        float a = p * f[i];
        cs[i] = static_cast<float>(std::cos(static_cast<double>(a))) * attn_factor;
        sn[i] = static_cast<float>(std::sin(static_cast<double>(a))) * attn_factor;
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x.ptr<float>() + (t * n_heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          float a = v[i], c = v[i + half];
          v[i] = a * cs[i] - c * sn[i];
          v[i + half] = c * cs[i] + a * sn[i];
        }
      }
    }
  }, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, n_heads * head_dim)));
}

void CpuBackend::kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, const KvTensor& k_cache,
                          const KvTensor& v_cache) {
  checks::each(require_f32, "kv_write", {{k, "k"}, {v, "v"}});
  require_i32(slots, "kv_write", "slots");
  checks::kv_write("cpu", k, v, slots, k_cache, v_cache);
  const int64_t n = slots.numel(), width = k.cols();
  const int64_t n_slots = k_cache.n_rows();
  for (int64_t t = 0; t < n; ++t) {
    const int64_t s = slots.ptr<int32_t>()[t];
    if (s >= n_slots) fail("cpu", "kv_write: slot {} outside a cache of {} rows", s, n_slots);
  }
  const KvQuant& q = k_cache.quant;
  // Quantizing is per row: prefill rows spread over the pool.
  pool_.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t s = slots.ptr<int32_t>()[t];
      if (s < 0) continue;  // a padding token: nothing to cache
      for (const auto& [src, c] : {std::pair{&k, &k_cache}, std::pair{&v, &v_cache}}) {
        const float* x = src->ptr<float>() + t * width;
        if (!q.on()) {
          std::memcpy(c->data.ptr<float>() + s * width, x, width * sizeof(float));
          continue;
        }
        const int64_t words = width * q.bits / 32, groups = width / q.group_size;
        quantize_kv_row(x, width, q, c->data.ptr<uint32_t>() + s * words, c->scales.ptr<uint16_t>() + s * groups,
                        c->biases.ptr<uint16_t>() + s * groups);
      }
    }
  }, q.on() ? 4 : n);
}

void CpuBackend::attention(const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache, const Tensor& block_tables,
                           const Tensor& token_seq, const Tensor& token_pos, const AttnParams& p, Tensor& out) {
  cpu::attention(k_, pool_, q, k_cache, v_cache, block_tables, token_seq, token_pos, p, out);
}

void CpuBackend::gated_act(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) {
  checks::each(require_f32, "gated_act", {{gate, "gate"}, {up, "up"}, {out, "out"}});
  checks::gated_act("cpu", gate, up, out);
  const int64_t n = gate.numel();
  const float *g = gate.ptr<float>(), *u = up.ptr<float>();
  float* o = out.ptr<float>();
  pool_.parallel_for(n, [&](int64_t b, int64_t e) {
    switch (act) {
      case Activation::silu:
        for (int64_t i = b; i < e; ++i) o[i] = silu(g[i]) * u[i];
        break;
      case Activation::gelu_tanh:
        for (int64_t i = b; i < e; ++i) o[i] = gelu_tanh(g[i]) * u[i];
        break;
      case Activation::gelu:
        for (int64_t i = b; i < e; ++i) o[i] = gelu_erf(g[i]) * u[i];
        break;
    }
  }, kElemChunk);
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& y) {
  checks::each(require_f32, "add", {{a, "a"}, {b, "b"}, {y, "y"}});
  checks::add("cpu", a, b, y);
  const int64_t n = a.numel();
  const float *pa = a.ptr<float>(), *pb = b.ptr<float>();
  float* py = y.ptr<float>();
  pool_.parallel_for(n, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) py[i] = pa[i] + pb[i];
  }, kElemChunk);
}

void CpuBackend::scale(Tensor& x, float s) {
  require_f32(x, "scale", "x");
  pool_.parallel_for(x.numel(), [&](int64_t b, int64_t e) { k_.scale(x.ptr<float>() + b, s, e - b); }, kElemChunk);
}

void CpuBackend::softcap(Tensor& x, float cap) {
  require_f32(x, "softcap", "x");
  checks::softcap("cpu", cap);
  float* p = x.ptr<float>();
  pool_.parallel_for(x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = cap * std::tanh(p[i] / cap);
  }, kElemChunk);
}

void CpuBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  require_i32(rows, "gather_rows", "rows");
  checks::gather_rows("cpu", x, rows, out);
  const int64_t n_out = rows.numel(), d = x.cols(), n = x.rows();
  const size_t row_bytes = d * dtype_size(x.dtype);
  for (int64_t i = 0; i < n_out; ++i) {
    const int64_t r = rows.ptr<int32_t>()[i];
    if (r < 0 || r >= n) fail("cpu", "gather_rows: row {} out of range [0, {})", r, n);
    std::memmove(static_cast<char*>(out.data) + i * row_bytes, static_cast<const char*>(x.data) + r * row_bytes,
                 row_bytes);
  }
}

void CpuBackend::scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) {
  require_i32(rows, "scatter_rows", "rows");
  checks::scatter_rows("cpu", src, rows, dst);
  const int64_t n_src = rows.numel(), n = dst.rows();
  const size_t row_bytes = dst.cols() * dtype_size(dst.dtype);
  for (int64_t i = 0; i < n_src; ++i) {
    const int64_t r = rows.ptr<int32_t>()[i];
    if (r < 0 || r >= n) fail("cpu", "scatter_rows: row {} out of range [0, {})", r, n);
    std::memmove(static_cast<char*>(dst.data) + r * row_bytes, static_cast<const char*>(src.data) + i * row_bytes,
                 row_bytes);
  }
}

}  // namespace kiln::backend::cpu

namespace kiln::backend {

std::unique_ptr<Backend> make_cpu_backend() { return cpu::make_cpu_backend_at(cpu::simd_level_from_env()); }

}  // namespace kiln::backend
