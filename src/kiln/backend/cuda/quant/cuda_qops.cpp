// CudaBackend's quantized matmul and embedding (host side): checks a quantized Weight as the CPU
// backend does (a malformed folder must not make a kernel read out of bounds), makes its three
// tensors resident, and picks the kernel: the quantized GEMV for decode-sized batches, else bf16 row
// chunks dequantized into per-step buffers and multiplied by cuBLASLt through the dense path.
// In graph replay mode every buffer is still allocated (same addresses) and no launch is issued.
#include "kiln/backend/cuda/quant/cuda_qops.h"

#include <algorithm>
#include <iterator>
#include <memory>

#include "kiln/backend/checks.h"
#include "kiln/backend/cuda/quant/qkernels.h"

namespace kiln::backend::cuda {

namespace {

// bf16 elements of one dequantized chunk (128 MB): q/k/v/o/gate/up/down of 8B-class models are one
// chunk each; a 128k-vocabulary head is a few.
constexpr int64_t kChunkElems = int64_t{64} << 20;

struct QResident {
  QWeightArgs args;
  Tensor w, scales, biases;  // device views (keep the copies alive for the call)
};

// Drops the device copy that holds host tensor t once no kernel reads it: t is that whole uploaded
// tensor, or a view inside it (an expert of a stacked switch_mlp tensor, a row slice of a fused
// projection) and the disjoint views re-laid out so far now cover it.
void drop_resident(CudaBackend::Impl& im, const Tensor& t) {
  if (t.device == Device::cuda) return;
  const auto p = reinterpret_cast<uintptr_t>(t.data);
  auto it = im.resident.upper_bound(p);
  if (it == im.resident.begin()) return;
  --it;
  CudaBackend::Impl::Resident& r = it->second;
  const size_t off = p - it->first, end = off + t.nbytes();
  if (end > r.bytes) return;  // not inside this tensor
  if (end - off < r.bytes) {
    const auto next = r.tiled.lower_bound(off);
    if (next != r.tiled.end() && next->first < end) return;  // overlaps a range already counted
    if (next != r.tiled.begin() && std::prev(next)->second > off) return;
    r.tiled.emplace(off, end);
    r.tiled_bytes += end - off;
    if (r.tiled_bytes < r.bytes) return;
  }
  im.stats.weight_bytes -= static_cast<int64_t>(r.bytes);
  im.resident.erase(it);
}

// A 4-bit weight lives on the device in the tiled layout only: at its first use (always an eager
// step: graph regions are recorded on a key's second step) its MLX copies, uploaded at load, are
// tiled and dropped (for views: once every view of the uploaded tensor is tiled).
QResident tiled_q4(CudaBackend::Impl& im, const Weight& w, const char* op, int64_t out, int64_t in) {
  const auto key = reinterpret_cast<uintptr_t>(w.w.data);
  auto it = im.q4_tiled.find(key);
  if (it != im.q4_tiled.end() && (it->second.out != out || it->second.in != in || it->second.group_size != w.group_size))
    fail("cuda", "{}: internal: a 4-bit weight at a reused address with another shape", op);
  const Dt sdt = dt_of(w.scales, op, "scales");
  if (it == im.q4_tiled.end()) {
    if (im.mode != CudaBackend::Impl::Mode::eager)
      fail("cuda", "{}: internal: a 4-bit weight first used inside a CUDA graph region", op);
    const Tensor codes = im.resident_of(w.w, op), sc = im.resident_of(w.scales, op), bi = im.resident_of(w.biases, op);
    const QWeightArgs mlx{static_cast<const uint32_t*>(codes.data), sc.data, bi.data, sdt, 4, w.group_size, out, in};
    const Q4Tiled z = q4_tiled_sizes(out, in, w.group_size, sdt);
    CudaBackend::Impl::Q4Tiled e{out, in, w.group_size, im.dev_alloc(DType::u8, {z.code_bytes}),
                                 im.dev_alloc(DType::u8, {z.pair_bytes}), w.w.holder};
    launch_q4_tile(mlx, e.codes.data, e.pairs.data, im.stream);
    im.q4_group = im.q4_group == 0 || im.q4_group == w.group_size ? w.group_size : -1;
    CUDA_CHECK(cudaStreamSynchronize(im.stream));
    im.stats.weight_bytes += z.code_bytes + z.pair_bytes;
    drop_resident(im, w.w);
    drop_resident(im, w.scales);
    drop_resident(im, w.biases);
    it = im.q4_tiled.emplace(key, std::move(e)).first;
  }
  QResident r;
  r.w = it->second.codes;
  r.scales = it->second.pairs;
  r.args = QWeightArgs{static_cast<const uint32_t*>(r.w.data), nullptr, nullptr, sdt, 4, w.group_size, out, in,
                       r.scales.data};
  return r;
}

QResident resident_quantized(CudaBackend::Impl& im, const Weight& w, const char* op) {
  const Tensor& t = w.w;
  if (w.bits != 2 && w.bits != 3 && w.bits != 4 && w.bits != 5 && w.bits != 6 && w.bits != 8)
    fail("cuda", "{}: quantized weight with {} bits (supported: 2, 3, 4, 5, 6, 8)", op, w.bits);
  if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128)
    fail("cuda", "{}: quantized weight with group size {} (supported: 32, 64, 128)", op, w.group_size);
  checks::quantized_weight("cuda", op, w);
  const int64_t out = t.dim(0), in = w.in_features();
  if (w.bits == 4) return tiled_q4(im, w, op, out, in);
  QResident r;
  r.w = im.resident_of(t, op);
  r.scales = im.resident_of(w.scales, op);
  r.biases = im.resident_of(w.biases, op);
  // Unit loads are bits * 4 bytes wide at offsets that are multiples of that (rows are whole units).
  const int need = w.bits % 4 == 0 ? 16 : (w.bits % 2 == 0 ? 8 : 4);
  if (reinterpret_cast<uintptr_t>(r.w.data) % need != 0)
    fail("cuda", "{}: quantized weight at a device address not aligned to {} bytes", op, need);
  r.args = QWeightArgs{static_cast<const uint32_t*>(r.w.data), r.scales.data, r.biases.data,
                       dt_of(w.scales, op, "scales"), w.bits, w.group_size, out, in};
  return r;
}

// The checks of one quantized matmul: shapes, the bias (resident), y not aliasing x.
struct QCall {
  QResident q;
  Tensor bias;
  Dt bias_dt = Dt::f32;
};

QCall check_quantized_matmul(CudaBackend::Impl& im, const Tensor& x, const Weight& w, const Tensor& y) {
  checks::each(require_act, "matmul", {{x, "x"}, {y, "y"}});
  QCall c;
  c.q = resident_quantized(im, w, "matmul");
  checks::matmul("cuda", x, w.w.shape, c.q.args.in, c.q.args.out, w.bias, y);
  if (!w.bias.empty()) {
    c.bias_dt = dt_of(w.bias, "matmul", "bias");
    c.bias = im.resident_of(w.bias, "matmul");
  }
  return c;
}

// x as 16-byte aligned bf16 rows (what the kernels read): x itself, or a per-step bf16 copy (the
// models pass bf16 activations from the arena, which need none).
Tensor bf16_input(CudaBackend& be, CudaBackend::Impl& im, const Tensor& x) {
  if (x.dtype == DType::bf16 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0) return x;
  Tensor xb = be.alloc(DType::bf16, {x.rows(), x.cols()});
  if (!im.skip(xb)) launch_convert(x.data, dt_of(x, "matmul", "x"), xb.data, Dt::bf16, x.numel(), im.stream);
  return xb;
}

// Records a 4-bit tiled GEMV's weight ranges (codes and pairs of each of its `count` matrices) for the
// L2 prefetch of a later step (Impl::next_gemv_prefetch); nothing when the prefetch is off.
void note_q4_gemv(CudaBackend::Impl& im, const QWeightArgs* w, int count) {
  if (!im.in_step || im.l2_prefetch_bytes <= 0) return;
  CudaBackend::Impl::Ranges r;
  for (int i = 0; i < count; ++i) {
    const Q4Tiled z = q4_tiled_sizes(w[i].out, w[i].in, w[i].group_size, w[i].sdt);
    r.emplace_back(w[i].w, z.code_bytes);
    r.emplace_back(w[i].pairs, z.pair_bytes);
  }
  im.gemv_seq.push_back(std::move(r));
}

}  // namespace

bool quantized_matmul_multi(CudaBackend& be, CudaBackend::Impl& im, const Tensor& x,
                            std::span<const Weight* const> ws, std::span<Tensor* const> ys) {
  const int64_t n = x.rows();
  if (ws.size() > static_cast<size_t>(kQMultiMax) || n == 0 || n > qgemv_max_tokens(4)) return false;
  for (const Weight* w : ws)  // one kernel instance: every matrix 4-bit with the first one's scales and groups
    if (!w->quantized() || w->bits != 4 || w->scales.dtype != ws[0]->scales.dtype ||
        w->group_size != ws[0]->group_size)
      return false;
  QMulti m{};
  for (size_t i = 0; i < ws.size(); ++i) {
    QCall c = check_quantized_matmul(im, x, *ws[i], *ys[i]);
    m.add(c.q.args, c.bias.empty() ? nullptr : c.bias.data, c.bias_dt, ys[i]->data, dt_of(*ys[i], "matmul", "y"));
  }
  Tensor xb = bf16_input(be, im, x);
  note_q4_gemv(im, m.w, m.count);
  const Tensor* cached = im.cached_qx(xb, n, m.w[0].in, m.w[0].group_size);
  Tensor qx = cached ? *cached : im.scratch(q4_qx_bytes(n, m.w[0].in, m.w[0].group_size));
  if (im.skip(ys)) return true;
  ProfScope ps(im, "matmul (qgemv)");
  launch_qgemv_multi(xb.data, n, m, im.n_sms, qx.data, cached != nullptr, im.stream);
  return true;
}

bool quantized_decoder_stack(CudaBackend& be, CudaBackend::Impl& im, const DecoderStackArgs& a, Tensor& x) {
  const AttnParams& ap = a.attn;
  auto on_device = [](const Tensor& t, DType dt) { return !t.empty() && t.device == Device::cuda && t.dtype == dt; };
  if (!im.opt.fused_decoder || live_cuda_backends() > 1 || a.layers.empty() ||
      a.layers.size() > static_cast<size_t>(kQDecoderMaxLayers) || x.rows() != 1 || !on_device(x, DType::bf16) ||
      ap.softcap > 0.0f || ap.n_kv_heads <= 0 ||
      int64_t{ap.block_size} * ap.max_blocks > kDecoderMaxKeys || !on_device(a.inv_freq, DType::f32) ||
      a.inv_freq.numel() * 2 != ap.head_dim || !on_device(a.block_tables, DType::i32))
    return false;
  for (const Tensor* t : {&a.positions, &a.slots, &a.token_seq})
    if (!on_device(*t, DType::i32) || t->numel() != 1) return false;
  const DecoderLayerRef& first = a.layers[0];
  const int64_t dim = x.cols(), hd = ap.head_dim, q_out = ap.n_heads * hd, kv_out = ap.n_kv_heads * hd;
  const int64_t ffn = first.gate ? first.gate->out_features() : 0;
  const int gs = first.q ? first.q->group_size : 0;
  const DType sdt = first.q ? first.q->scales.dtype : DType::f32;
  if (sdt == DType::f32) return false;
  auto d = std::make_unique<QDecoder>();  // ~15 KB: the kernel's parameter
  d->n_layers = static_cast<int>(a.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const DecoderLayerRef& L = a.layers[l];
    const Weight* ws[] = {L.q, L.k, L.v, L.o, L.gate, L.up, L.down};
    const int64_t outs[] = {q_out, kv_out, kv_out, dim, ffn, ffn, dim}, ins[] = {dim, dim, dim, q_out, dim, dim, ffn};
    for (int i = 0; i < 7; ++i) {
      const Weight* w = ws[i];
      if (!w || !w->quantized() || w->bits != 4 || !w->bias.empty() || w->group_size != gs || w->scales.dtype != sdt ||
          w->out_features() != outs[i] || w->in_features() != ins[i])
        return false;
    }
    for (const Tensor* n : {L.attn_norm, L.mlp_norm})
      if (!n || n->dtype != DType::bf16 || n->numel() != dim) return false;
    for (const KvTensor* c : {L.k_cache, L.v_cache})  // float caches only (a quantized one runs op by op)
      if (!c || c->quantized() || !on_device(c->data, DType::bf16) || c->data.numel() % kv_out != 0) return false;
    if (L.k_cache->data.numel() != L.v_cache->data.numel()) return false;
    if (L.sink > 0) return false;  // a rotating cache's sink keys: the layer-by-layer path has them
  }
  d->dim = dim, d->ffn = ffn, d->n_heads = ap.n_heads, d->n_kv_heads = ap.n_kv_heads, d->head_dim = hd;
  d->n_slots = first.k_cache->data.numel() / kv_out;
  d->sdt = sdt == DType::bf16 ? Dt::bf16 : Dt::f16, d->group_size = gs, d->act = static_cast<int>(a.act);
  d->eps = a.eps, d->scale = ap.scale, d->attn_factor = a.attn_factor;
  if (!q4_decoder_fits(*d, im.n_sms)) return false;
  for (size_t l = 0; l < a.layers.size(); ++l) {  // resident now (4-bit weights are tiled at their first use)
    const DecoderLayerRef& L = a.layers[l];
    QDecoderLayer& o = d->layers[l];
    const Weight* ws[] = {L.q, L.k, L.v, L.o, L.gate, L.up, L.down};
    for (int i = 0; i < 7; ++i) {
      const QResident r = resident_quantized(im, *ws[i], "decoder_stack");
      o.codes[i] = r.args.w, o.pairs[i] = r.args.pairs;
    }
    o.attn_norm = im.resident_of(*L.attn_norm, "decoder_stack").data;
    o.mlp_norm = im.resident_of(*L.mlp_norm, "decoder_stack").data;
    if (reinterpret_cast<uintptr_t>(o.attn_norm) % 16 != 0 || reinterpret_cast<uintptr_t>(o.mlp_norm) % 16 != 0)
      return false;  // copied in 16-byte pieces
    o.k_cache = L.k_cache->data.data, o.v_cache = L.v_cache->data.data;
    o.window = L.window;
  }
  d->inv_freq = static_cast<const float*>(a.inv_freq.data);
  d->pos = static_cast<const int32_t*>(a.positions.data);
  d->slots = static_cast<const int32_t*>(a.slots.data);
  d->token_seq = static_cast<const int32_t*>(a.token_seq.data);
  d->block_tables = static_cast<const int32_t*>(a.block_tables.data);
  d->block_size = ap.block_size, d->max_blocks = ap.max_blocks;
  Tensor qkv = be.alloc(DType::bf16, {q_out + 2 * kv_out}), attn = be.alloc(DType::bf16, {q_out}),
         h = be.alloc(DType::bf16, {ffn}), partials = be.alloc(DType::f32, {q4_decoder_partial_floats(*d, im.n_sms)});
  d->x = x.data, d->qkv = qkv.data, d->attn = attn.data, d->h = h.data;
  d->partials = static_cast<float*>(partials.data);
  d->counters = reinterpret_cast<unsigned*>(im.grid_barrier + kGridMaxBlocks + 1);
  if (im.skip()) return true;
  ProfScope ps(im, "decoder_stack (4-bit)");
  launch_q4_decoder(*d, im.grid_barrier, im.n_sms, im.stream);
  ++im.stats.fused_decoders;
  return true;
}

void quantized_matmul(CudaBackend& be, CudaBackend::Impl& im, const Tensor& x, const Weight& w, Tensor& y) {
  QCall c = check_quantized_matmul(im, x, w, y);
  const QResident& q = c.q;
  const Tensor& B = c.bias;
  const int64_t out = q.args.out, in = q.args.in, n = x.rows();
  if (n == 0) return;
  Tensor xb = bf16_input(be, im, x);
  const Dt ydt = dt_of(y, "matmul", "y");
  if (n <= qgemv_max_tokens(w.bits)) {
    Tensor qx;  // the tiled 4-bit kernel's quantized activations: x's cached ones or made here
    const Tensor* cached = q.args.pairs ? im.cached_qx(xb, n, in, w.group_size) : nullptr;
    if (q.args.pairs) {
      qx = cached ? *cached : im.scratch(q4_qx_bytes(n, in, w.group_size));
      note_q4_gemv(im, &q.args, 1);
    }
    if (im.skip(y)) return;
    ProfScope ps(im, "matmul (qgemv)");
    launch_qgemv(xb.data, n, q.args, B.empty() ? nullptr : B.data, c.bias_dt, y.data, ydt, im.n_sms, qx.data,
                 cached != nullptr, im.stream);
    return;
  }
  // Prefill / large batches: chunks of whole rows (a multiple of 128) dequantized to bf16, then the
  // dense path (cuBLASLt for bf16). With several chunks each result lands in its own buffer and is
  // copied into y's columns [r0, r0 + rows) (y is [n, out] row-major).
  const int64_t chunk = std::min(out, std::max<int64_t>(128, kChunkElems / std::max<int64_t>(1, in) / 128 * 128));
  const size_t esize = dtype_size(y.dtype);
  for (int64_t r0 = 0; r0 < out; r0 += chunk) {
    const int64_t rows = std::min(chunk, out - r0);
    Weight dense;
    dense.w = be.alloc(DType::bf16, {rows, in});
    if (!im.skip(dense.w)) {
      ProfScope ps(im, "matmul (q dequant)");
      launch_qdequant_rows(q.args, nullptr, r0, rows, dense.w.data, Dt::bf16, im.stream);
    }
    if (rows == out) {
      be.matmul(xb, dense, y);
    } else {
      Tensor yc = be.alloc(y.dtype, {n, rows});
      be.matmul(xb, dense, yc);
      if (!im.skip(y))
        CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(y.data) + r0 * esize, out * esize, yc.data, rows * esize,
                                     rows * esize, n, cudaMemcpyDeviceToDevice, im.stream));
    }
  }
  if (!B.empty() && !im.skip(y)) launch_add_bias(y.data, ydt, n, out, B.data, dt_of(B, "matmul", "bias"), im.stream);
}

void quantized_embedding(CudaBackend& be, CudaBackend::Impl& im, const Weight& table, const Tensor& ids,
                         Tensor& out) {
  if (ids.dtype != DType::i32) fail("cuda", "embedding: ids must be int32, got {}", dtype_name(ids.dtype));
  if (ids.numel() != 0 && (ids.empty() || ids.device != Device::cuda))
    fail("cuda", "embedding: ids is in host memory; upload it first");
  require_act(out, "embedding", "out");
  QResident q = resident_quantized(im, table, "embedding");
  const int64_t n = ids.numel(), dim = q.args.in;
  checks::embedding_out("cuda", out, n, dim);
  if (im.skip() || n == 0) return;
  ProfScope ps(im, "embedding (quantized)");
  launch_qdequant_rows(q.args, ids.ptr<int32_t>(), 0, n, out.data, dt_of(out, "embedding", "out"), im.stream);
}

}  // namespace kiln::backend::cuda
