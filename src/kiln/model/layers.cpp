// Shared blocks of the decoder families. Shapes: x [n_tokens, dim]; q [n_tokens, n_heads * head_dim];
// k, v [n_tokens, n_kv_heads * head_dim]; cache [n_blocks, block_size, n_kv_heads * head_dim].
#include "kiln/model/layers.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "kiln/backend/kv_quant.h"
#include "kiln/quant/affine.h"

namespace kiln::model {

using backend::Weight;

backend::Weight load_linear(const io::WeightSet& ws, const std::string& prefix, const ModelConfig& c) {
  Weight w;
  w.w = ws.get(prefix + ".weight");
  if (w.w.ndim() != 2) fail("weights", "{}.weight must be 2-D, got {}", prefix, shape_str(w.w.shape));
  if (const Tensor* b = ws.find(prefix + ".bias")) w.bias = *b;
  const bool has_scales = ws.has(prefix + ".scales");
  std::optional<quant::QuantParams> qp;
  if (c.quant) qp = c.quant->for_module(prefix, has_scales);
  if (qp && !has_scales)
    fail("weights", "{}: config.json's quantization section says {}-bit, but {}.scales is missing", prefix, qp->bits,
         prefix);
  if (has_scales && !qp)
    fail("weights", "{} has .scales (a quantized layer) but config.json has no quantization section for it; "
         "add mlx-lm's \"quantization\": {{\"group_size\": ..., \"bits\": ...}}", prefix);
  if (qp) {
    w.scales = ws.get(prefix + ".scales");
    w.biases = ws.get(prefix + ".biases");
    quant::check_layout(w.w, w.scales, w.biases, qp->bits, qp->group_size, prefix);
    w.bits = qp->bits;
    w.group_size = qp->group_size;
    return w;
  }
  auto t = w.w.dtype;
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16)
    fail("weights", "{}.weight has dtype {}; expected float32, bfloat16 or float16", prefix, dtype_name(t));
  return w;
}

backend::Weight load_embedding(const io::WeightSet& ws, const ModelConfig& c) {
  Weight e = load_linear(ws, "model.embed_tokens", c);
  if (e.in_features() != c.dim)
    fail("weights", "model.embed_tokens.weight has {} columns; config.json says hidden_size {}", e.in_features(), c.dim);
  e.bias = {};  // an embedding has no bias
  return e;
}

Tensor load_vector(const io::WeightSet& ws, const std::string& name, bool required) {
  const Tensor* t = ws.find(name);
  if (!t) {
    if (required) ws.get(name);  // throws with the folder and name
    return {};
  }
  return *t;
}

static Tensor upload_i32(backend::Backend& be, const std::vector<int32_t>& v) {
  Tensor h = Tensor::host(DType::i32, {static_cast<int64_t>(std::max<size_t>(v.size(), 1))});
  std::copy(v.begin(), v.end(), h.ptr<int32_t>());
  Tensor d = be.upload(h);
  d.shape = {static_cast<int64_t>(v.size())};
  return d;
}

// The RoPE table of config r at seq_len, on the device. transformers keeps inv_freq as a buffer in
// the checkpoint's dtype, so a bf16/f16 model rotates by rounded frequencies; round the same way to
// match it (the difference is ~1e-4 of the logits).
static DeviceRope upload_rope(backend::Backend& be, const RopeConfig& r, const ModelConfig& c, int seq_len) {
  RopeTable t = rope_table(r, c.head_dim, c.max_position_embeddings, seq_len);
  Tensor h = Tensor::host(DType::f32, {static_cast<int64_t>(t.inv_freq.size())});
  for (size_t i = 0; i < t.inv_freq.size(); ++i) h.ptr<float>()[i] = round_to_model_dtype(t.inv_freq[i], c);
  return {be.upload(h), t.attn_factor};
}

StepInputs upload_step(const Model& m, const Batch& b) {
  backend::Backend& be = m.backend();
  StepInputs s;
  s.n_tokens = b.n_tokens();
  s.n_out = static_cast<int>(b.logit_rows.size());
  s.n_seqs = b.n_seqs;
  s.max_blocks = b.max_blocks;
  s.tokens = upload_i32(be, b.tokens);
  s.positions = upload_i32(be, b.positions);
  s.token_seq = upload_i32(be, b.token_seq);
  s.slots = upload_i32(be, b.slots);
  s.block_tables = upload_i32(be, b.block_tables);
  s.logit_rows = upload_i32(be, b.logit_rows);
  for (int p : b.positions) s.max_position = std::max(s.max_position, p);
  for (const RopeConfig* r : m.rope_configs()) s.ropes.push_back(upload_rope(be, *r, m.config(), s.max_position + 1));
  return s;
}

backend::AttnParams attn_params(const ModelConfig& c, const AttentionOptions& o, int block_size, int max_blocks) {
  return {.n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .scale = o.scale,
          .softcap = o.softcap, .window = o.window, .sink = o.sink, .block_size = block_size, .max_blocks = max_blocks};
}

void attention_block(backend::Backend& be, const ModelConfig& c, const AttentionWeights& w, const AttentionOptions& o,
                     const Tensor& x, const StepInputs& in, const backend::KvTensor& k_cache,
                     const backend::KvTensor& v_cache, int block_size, Tensor& out) {
  const int64_t n = in.n_tokens, hd = c.head_dim;
  const DType t = be.act_dtype();
  Tensor q = be.alloc(t, {n, c.n_heads * hd});      // [n, n_heads * head_dim]
  Tensor k = be.alloc(t, {n, c.n_kv_heads * hd});   // [n, n_kv_heads * head_dim]
  Tensor v = be.alloc(t, {n, c.n_kv_heads * hd});
  const Weight* qkv_w[] = {&w.q, &w.k, &w.v};
  Tensor* qkv_y[] = {&q, &k, &v};
  be.matmul_multi(x, qkv_w, qkv_y);  // one launch for batch-1 bf16 on CUDA
  if (!w.q_norm.empty()) {  // per-head RMSNorm over head_dim (qwen3, gemma3)
    Tensor qh = q.view({n * c.n_heads, hd}), kh = k.view({n * c.n_kv_heads, hd});
    be.rms_norm(qh, w.q_norm, static_cast<float>(o.norm_eps), o.norm_one_plus, qh);
    be.rms_norm(kh, w.k_norm, static_cast<float>(o.norm_eps), o.norm_one_plus, kh);
  }
  Tensor q3 = q.view({n, c.n_heads, hd}), k3 = k.view({n, c.n_kv_heads, hd});
  be.rope_kv_write(q3, k3, v, in.positions, o.inv_freq, o.rope_attn_factor, in.slots, k_cache, v_cache);

  const backend::AttnParams p = attn_params(c, o, block_size, in.max_blocks);
  Tensor attn = be.alloc(t, {n, c.n_heads * hd});
  be.attention(q, k_cache, v_cache, in.block_tables, in.token_seq, in.positions, p, attn);
  be.matmul(attn, w.o, out);
}

void mlp_block(backend::Backend& be, const MlpWeights& w, backend::Activation act, const Tensor& x, Tensor& out) {
  be.gated_mlp(x, w.gate, w.up, w.down, act, out);
}

float round_to_model_dtype(float v, const ModelConfig& c) {
  if (c.dtype == "bfloat16") return bf16_to_f32(f32_to_bf16(v));
  if (c.dtype == "float16") return f16_to_f32(f32_to_f16(v));
  return v;
}

static void check_rows(const Weight& w, int64_t rows, const std::string& name) {
  if (w.out_features() != rows) fail("weights", "{} has {} rows; config.json implies {}", name, w.out_features(), rows);
}

static Weight row_slice(const Weight& w, int64_t b, int64_t e) {
  Weight r;
  r.w = w.w.slice_rows(b, e);
  if (!w.bias.empty()) r.bias = w.bias.slice_rows(b, e);
  if (w.quantized()) {  // rows of the packed weight and of its scales/biases go together
    r.scales = w.scales.slice_rows(b, e);
    r.biases = w.biases.slice_rows(b, e);
    r.bits = w.bits;
    r.group_size = w.group_size;
  }
  return r;
}

AttentionWeights load_attention(const io::WeightSet& ws, const std::string& p, const ModelConfig& c) {
  const int64_t q_out = static_cast<int64_t>(c.n_heads) * c.head_dim, kv_out = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  AttentionWeights a;
  if (ws.has(p + "qkv_proj.weight")) {  // phi3: rows [q | k | v]
    Weight qkv = load_linear(ws, p + "qkv_proj", c);
    check_rows(qkv, q_out + 2 * kv_out, p + "qkv_proj.weight");
    a.q = row_slice(qkv, 0, q_out);
    a.k = row_slice(qkv, q_out, q_out + kv_out);
    a.v = row_slice(qkv, q_out + kv_out, q_out + 2 * kv_out);
  } else {
    a.q = load_linear(ws, p + "q_proj", c);
    a.k = load_linear(ws, p + "k_proj", c);
    a.v = load_linear(ws, p + "v_proj", c);
    check_rows(a.q, q_out, p + "q_proj.weight");
    check_rows(a.k, kv_out, p + "k_proj.weight");
    check_rows(a.v, kv_out, p + "v_proj.weight");
  }
  a.o = load_linear(ws, p + "o_proj", c);
  a.q_norm = load_vector(ws, p + "q_norm.weight", false);
  a.k_norm = load_vector(ws, p + "k_norm.weight", false);
  return a;
}

MlpWeights load_mlp(const io::WeightSet& ws, const std::string& p, const ModelConfig& c) {
  MlpWeights m;
  if (ws.has(p + "gate_up_proj.weight")) {  // phi3: rows [gate | up]
    Weight gu = load_linear(ws, p + "gate_up_proj", c);
    int64_t ffn = gu.out_features() / 2;
    m.gate = row_slice(gu, 0, ffn);
    m.up = row_slice(gu, ffn, 2 * ffn);
    m.down = load_linear(ws, p + "down_proj", c);
  } else if (ws.has(p + "w1.weight")) {  // mixtral experts
    m.gate = load_linear(ws, p + "w1", c);
    m.up = load_linear(ws, p + "w3", c);
    m.down = load_linear(ws, p + "w2", c);
  } else {
    m.gate = load_linear(ws, p + "gate_proj", c);
    m.up = load_linear(ws, p + "up_proj", c);
    m.down = load_linear(ws, p + "down_proj", c);
  }
  return m;
}

Tensor output_logits(backend::Backend& be, Tensor& x, const StepInputs& in, const Tensor& final_norm, float eps,
                     bool one_plus_w, const backend::Weight& head, float softcap, const Tensor* pending) {
  Tensor last = be.alloc(be.act_dtype(), {in.n_out, x.dim(1)});  // [n_out, dim]
  if (pending) {
    // x += pending and the norm in one op over all rows; the norm is per row, so gathering the
    // normed rows equals norming the gathered ones (the extra rows cost a prefill little).
    Tensor normed = be.alloc(be.act_dtype(), {x.dim(0), x.dim(1)});  // [n_tokens, dim]
    be.add_rms_norm(x, *pending, final_norm, eps, one_plus_w, normed);
    be.gather_rows(normed, in.logit_rows, last);
  } else {
    be.gather_rows(x, in.logit_rows, last);
    be.rms_norm(last, final_norm, eps, one_plus_w, last);
  }
  Tensor logits = be.alloc(DType::f32, {in.n_out, head.out_features()});  // [n_out, vocab] f32 on every backend
  be.matmul(last, head, logits);
  if (softcap > 0) be.softcap(logits, softcap);
  return logits;
}

backend::Activation activation_from_name(const std::string& name, const std::string& where) {
  if (name == "silu" || name == "swish") return backend::Activation::silu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_fast") return backend::Activation::gelu_tanh;
  if (name == "gelu") return backend::Activation::gelu;
  fail("config", "{}: unsupported activation \"{}\" (supported: silu, gelu, gelu_pytorch_tanh)", where, name);
}

KvCache KvCache::allocate(backend::Backend& be, const ModelConfig& c, int n_blocks, int block_size) {
  KvCache kv;
  kv.n_blocks = n_blocks;
  kv.block_size = block_size;
  kv.quant = c.kv_quant;
  backend::check_kv_quant(kv.quant, c.head_dim);
  const int64_t width = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  auto alloc = [&](DType t, Shape s) { return be.alloc(t, std::move(s)); };
  for (int l = 0; l < c.n_layers; ++l) {
    kv.k.push_back(backend::make_kv_tensor(alloc, kv.quant, n_blocks, block_size, width, be.act_dtype()));
    kv.v.push_back(backend::make_kv_tensor(alloc, kv.quant, n_blocks, block_size, width, be.act_dtype()));
  }
  return kv;
}

size_t KvCache::bytes() const {
  size_t b = 0;
  for (const Tensor* t : planes()) b += t->nbytes();
  return b;
}

std::vector<const Tensor*> KvCache::planes() const {
  std::vector<const Tensor*> p;
  for (size_t l = 0; l < k.size(); ++l)
    for (const backend::KvTensor* c : {&k[l], &v[l]}) {
      p.push_back(&c->data);
      if (c->quantized()) {
        p.push_back(&c->scales);
        p.push_back(&c->biases);
      }
    }
  return p;
}

std::vector<Tensor*> KvCache::planes() {
  std::vector<Tensor*> p;
  for (const Tensor* t : std::as_const(*this).planes()) p.push_back(const_cast<Tensor*>(t));
  return p;
}

}  // namespace kiln::model
