// The argument checks the CPU and CUDA backends share (checks.h): one condition and one message per
// check, prefixed by the calling backend's name.
#include "kiln/backend/checks.h"

namespace kiln::backend::checks {

namespace {
bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }
}  // namespace

void quantized_weight(const char* who, const char* op, const Weight& w) {
  const std::string at = op ? std::string(op) + ": " : std::string();
  const Tensor& t = w.w;
  if (t.dtype != DType::u32 || t.ndim() != 2 || (t.dim(1) * 32) % w.bits != 0)
    fail(who, "{}quantized weight must be 2-D uint32 holding whole {}-bit codes, got {} {}", at, w.bits,
         dtype_name(t.dtype), shape_str(t.shape));
  const int64_t out = t.dim(0), in = w.in_features();
  if (w.group_size <= 0 || in % w.group_size != 0 || w.group_size % 16 != 0)
    fail(who, "{}quantized weight: group size {} does not divide the input dimension {}", at, w.group_size, in);
  const Shape gshape{out, in / w.group_size};
  if (!is_float(w.scales.dtype) || w.scales.shape != gshape || w.biases.dtype != w.scales.dtype ||
      w.biases.shape != gshape)
    fail(who, "{}quantized weight: scales {} {} / biases {} {} do not match {} groups per row of {} rows", at,
         dtype_name(w.scales.dtype), shape_str(w.scales.shape), dtype_name(w.biases.dtype), shape_str(w.biases.shape),
         in / w.group_size, out);
}

void float_matrix(const char* who, const char* op, const char* what, const Tensor& t) {
  if (!is_float(t.dtype) || t.ndim() != 2)
    fail(who, "{}: {} must be a 2-D float tensor, got {} {}", op, what, dtype_name(t.dtype), shape_str(t.shape));
}

void matmul(const char* who, const Tensor& x, const Shape& wshape, int64_t in, int64_t out, const Tensor& bias,
            const Tensor& y) {
  if (x.cols() != in) fail(who, "matmul: x {} does not match weight {}", shape_str(x.shape), shape_str(wshape));
  const int64_t n = x.rows();
  if (y.numel() != n * out)
    fail(who, "matmul: y {} for x {} and weight {}", shape_str(y.shape), shape_str(x.shape), shape_str(wshape));
  if (n != 0 && x.data == y.data) fail(who, "matmul: y must not alias x");
  if (!bias.empty() && (!is_float(bias.dtype) || bias.numel() != out))
    fail(who, "matmul: bias {} {} for {} outputs", dtype_name(bias.dtype), shape_str(bias.shape), out);
}

void embedding_out(const char* who, const Tensor& out, int64_t n, int64_t dim) {
  if (out.numel() != n * dim) fail(who, "embedding: out {} for {} ids of dim {}", shape_str(out.shape), n, dim);
}

void rms_norm(const char* who, const Tensor& x, const Tensor& w, const Tensor& y) {
  if (!is_float(w.dtype) || w.numel() != x.cols())
    fail(who, "rms_norm: weight {} {} for rows of {}", dtype_name(w.dtype), shape_str(w.shape), x.cols());
  if (y.numel() != x.numel() || y.dtype != x.dtype)
    fail(who, "rms_norm: y {} {} for x {} {}", dtype_name(y.dtype), shape_str(y.shape), dtype_name(x.dtype),
         shape_str(x.shape));
}

void rope(const char* who, const Tensor& x, const Tensor& pos, const Tensor& inv_freq) {
  if (inv_freq.dtype != DType::f32) fail(who, "rope: inv_freq must be float32, got {}", dtype_name(inv_freq.dtype));
  if (x.ndim() != 3) fail(who, "rope: x must be [n_tokens, n_heads, head_dim], got {}", shape_str(x.shape));
  if (pos.numel() != x.dim(0)) fail(who, "rope: {} positions for {} tokens", pos.numel(), x.dim(0));
  if (2 * inv_freq.numel() > x.dim(2))
    fail(who, "rope: rotary dim {} exceeds head_dim {}", 2 * inv_freq.numel(), x.dim(2));
}

const Tensor& float_kv(const char* who, const char* op, const KvTensor& t) {
  if (t.quantized())
    fail(who, "{}: a quantized KV cache ({}-bit, --kv-bits) is not supported on this backend; run without --kv-bits "
         "or on the CPU", op, t.quant.bits);
  return t.data;
}

int64_t kv_tensor(const char* who, const char* op, const KvTensor& t, int64_t width, DType float_dtype) {
  const int64_t rows = t.data.rows();
  if (!t.quantized()) {
    if (t.data.cols() != width || t.data.dtype != float_dtype || !t.scales.empty())
      fail(who, "{}: cache {} {} is not rows of {} {} values", op, dtype_name(t.data.dtype), shape_str(t.data.shape),
           width, dtype_name(float_dtype));
    return rows;
  }
  const KvQuant& q = t.quant;
  if ((q.bits != 4 && q.bits != 8) || q.group_size <= 0 || width % q.group_size != 0 || (q.group_size * q.bits) % 32)
    fail(who, "{}: a {}-bit cache with groups of {} cannot hold rows of {}", op, q.bits, q.group_size, width);
  if (t.data.dtype != DType::u32 || t.data.cols() != width * q.bits / 32 || t.scales.dtype != DType::f16 ||
      t.biases.dtype != DType::f16 || t.scales.cols() != width / q.group_size ||
      t.biases.cols() != width / q.group_size || t.scales.rows() != rows || t.biases.rows() != rows)
    fail(who, "{}: quantized cache codes {} {} scales {} {} biases {} {} are not rows of {} values at {} bits, groups of {}",
         op, dtype_name(t.data.dtype), shape_str(t.data.shape), dtype_name(t.scales.dtype), shape_str(t.scales.shape),
         dtype_name(t.biases.dtype), shape_str(t.biases.shape), width, q.bits, q.group_size);
  return rows;
}

void kv_write(const char* who, const Tensor& k, const Tensor& v, const Tensor& slots, const KvTensor& k_cache,
              const KvTensor& v_cache) {
  const int64_t n = slots.numel(), width = k.cols();
  if (k.numel() != n * width || v.numel() != n * width || v.dtype != k.dtype || !(k_cache.quant == v_cache.quant))
    fail(who, "kv_write: k {} v {} slots {} caches {} {}", shape_str(k.shape), shape_str(v.shape), n,
         shape_str(k_cache.data.shape), shape_str(v_cache.data.shape));
  if (kv_tensor(who, "kv_write", k_cache, width, k.dtype) != kv_tensor(who, "kv_write", v_cache, width, k.dtype))
    fail(who, "kv_write: K and V caches of different rows");
}

void attention(const char* who, const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache,
               const Tensor& block_tables, const Tensor& token_seq, const Tensor& token_pos, const AttnParams& p,
               const Tensor& out) {
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.head_dim <= 0 || p.n_heads % p.n_kv_heads != 0 ||
      p.block_size <= 0 || p.max_blocks <= 0)
    fail(who, "attention: bad params n_heads={} n_kv_heads={} head_dim={} block_size={} max_blocks={}", p.n_heads,
         p.n_kv_heads, p.head_dim, p.block_size, p.max_blocks);
  const int64_t n = token_seq.numel(), q_width = int64_t{p.n_heads} * p.head_dim,
                kv_width = int64_t{p.n_kv_heads} * p.head_dim;
  if (token_pos.numel() != n || q.numel() != n * q_width || out.numel() != n * q_width)
    fail(who, "attention: q {} out {} for {} tokens of {} heads x {}", shape_str(q.shape), shape_str(out.shape), n,
         p.n_heads, p.head_dim);
  const DType float_dtype = k_cache.data.dtype;  // a float cache's dtype is the backend's to check
  const int64_t rows = kv_tensor(who, "attention", k_cache, kv_width, float_dtype);
  if (!(k_cache.quant == v_cache.quant) || kv_tensor(who, "attention", v_cache, kv_width, float_dtype) != rows ||
      rows % p.block_size != 0 || (k_cache.quantized() && p.head_dim % k_cache.quant.group_size != 0))
    fail(who, "attention: caches {} / {} are not [n_blocks, {}, {}] of one layout", shape_str(k_cache.data.shape),
         shape_str(v_cache.data.shape), p.block_size, kv_width);
  if (block_tables.numel() % p.max_blocks != 0)
    fail(who, "attention: block_tables of {} entries is not n_seqs x {}", block_tables.numel(), p.max_blocks);
}

void gated_act(const char* who, const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t n = gate.numel();
  if (up.numel() != n || out.numel() != n || up.dtype != gate.dtype || out.dtype != gate.dtype)
    fail(who, "gated_act: gate {} up {} out {}", shape_str(gate.shape), shape_str(up.shape), shape_str(out.shape));
}

void add(const char* who, const Tensor& a, const Tensor& b, const Tensor& y) {
  const int64_t n = a.numel();
  if (b.numel() != n || y.numel() != n || a.dtype != b.dtype || a.dtype != y.dtype)
    fail(who, "add: a {} b {} y {}", shape_str(a.shape), shape_str(b.shape), shape_str(y.shape));
}

void softcap(const char* who, float cap) {
  if (!(cap > 0)) fail(who, "softcap: cap must be > 0, got {}", cap);
}

void gather_rows(const char* who, const Tensor& x, const Tensor& rows, const Tensor& out) {
  if (out.dtype != x.dtype || out.numel() != rows.numel() * x.cols())
    fail(who, "gather_rows: out {} {} for {} rows of {} {}", dtype_name(out.dtype), shape_str(out.shape), rows.numel(),
         dtype_name(x.dtype), shape_str(x.shape));
}

void scatter_rows(const char* who, const Tensor& src, const Tensor& rows, const Tensor& dst) {
  if (src.dtype != dst.dtype || src.numel() != rows.numel() * dst.cols())
    fail(who, "scatter_rows: src {} {} for {} rows of {} {}", dtype_name(src.dtype), shape_str(src.shape), rows.numel(),
         dtype_name(dst.dtype), shape_str(dst.shape));
}

void copy(const char* who, const Tensor& src, const Tensor& dst) {
  if (src.dtype != dst.dtype || src.numel() != dst.numel())
    fail(who, "copy: {} {} into {} {}", dtype_name(src.dtype), shape_str(src.shape), dtype_name(dst.dtype),
         shape_str(dst.shape));
}

}  // namespace kiln::backend::checks
