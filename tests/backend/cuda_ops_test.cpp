// Backend-ops parity: every CUDA op against the CPU reference backend, on fresh random inputs each
// run (the seed is printed; KILN_TEST_SEED=<n> replays it), over several shapes per op: odd sizes,
// long contexts, sliding windows, ragged batches of many sequences. Activations are drawn as bf16
// values so both backends see the same numbers; outputs are poisoned with NaN before each op.
// Tolerances (per output dtype), on ‖gpu − cpu‖₂ / ‖cpu‖₂ and max |gpu − cpu| / max |cpu|:
//   bf16 outputs: rel-L2 ≤ 1e-2 and max ≤ 2^-6 (a few bf16 ulps at the top of the range);
//   f32 outputs (logits): rel-L2 ≤ 1e-4 and max ≤ 1e-4 (only the summation order differs).
// Reports SKIPPED where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cpu_test_util.h"
#include "kiln/backend/kv_quant.h"
#ifdef KILN_HAVE_CUDA
#include "kiln/backend/cuda/cuda_backend.h"
#endif

namespace kiln::backend {
namespace {

using cpu::test::Rng;
using cpu::test::to_floats;

struct Tol {
  double rel_l2, rel_max;
};
Tol tol_for(DType out) { return out == DType::f32 ? Tol{1e-4, 1e-4} : Tol{1e-2, 1.0 / 64}; }

// Compares the device result (any float dtype) with the CPU's f32 result; every value must be finite.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, DType out_dtype, const std::string& what) {
  const Tol tol = tol_for(out_dtype);
  cpu::test::CloseStats st;
  ASSERT_NO_FATAL_FAILURE(cpu::test::close_stats(got, ref, what, &st));
  const double rel = st.sq_ref > 0 ? std::sqrt(st.sq_err / st.sq_ref) : std::sqrt(st.sq_err);
  const double relmax = st.max_ref > 0 ? st.max_err / st.max_ref : st.max_err;
  EXPECT_LE(rel, tol.rel_l2) << what << " rel-L2";
  EXPECT_LE(relmax, tol.rel_max) << what << " max error / max |ref|";
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    gpu_ = make_cuda_backend(0);
    cpu_ = make_cpu_backend();
  }
  // A host tensor of activations: values of `store` dtype (bf16 by default), held as f32 for the CPU.
  Tensor act(Rng& rng, Shape s, float scale = 1.0f, DType store = DType::bf16) {
    Tensor t = rng.tensor(store, std::move(s), scale);
    return as_f32(t);
  }
  static Tensor as_f32(const Tensor& t) {
    Tensor r = Tensor::host(DType::f32, t.shape);
    to_f32(t.data, t.dtype, r.ptr<float>(), t.numel());
    return r;
  }
  static Tensor as_bf16(const Tensor& f) {
    Tensor r = Tensor::host(DType::bf16, f.shape);
    for (int64_t i = 0; i < f.numel(); ++i) r.ptr<uint16_t>()[i] = f32_to_bf16(f.ptr<float>()[i]);
    return r;
  }
  // The device copy of an f32 host tensor in dtype t.
  Tensor dev(const Tensor& f32, DType t = DType::bf16) { return gpu_->upload(t == DType::f32 ? f32 : as_bf16(f32)); }
  // A device tensor poisoned with NaN (bf16 0xFFFF / f32 NaN).
  Tensor poisoned(DType t, Shape s) { return cpu::test::poisoned(*gpu_, t, std::move(s)); }
  std::vector<float> back(const Tensor& d) { return to_floats(gpu_->to_host(d)); }
  static Tensor ints(const std::vector<int32_t>& v) { return cpu::test::host_ints(v); }

  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_F(CudaOps, Embedding) {
  Rng rng("CudaOps.Embedding");
  for (DType wt : {DType::f32, DType::bf16, DType::f16})
    for (auto [vocab, dim] : std::vector<std::pair<int64_t, int64_t>>{{512, 64}, {1000, 77}, {32000, 4096}}) {
      SCOPED_TRACE(fmt::format("{} vocab={} dim={}", dtype_name(wt), vocab, dim));
      Weight table;
      table.w = rng.tensor(wt, {vocab, dim});
      std::vector<int32_t> id(37);
      for (auto& v : id) v = static_cast<int32_t>(rng.uniform_int(0, vocab - 1));
      Tensor ref = Tensor::host(DType::f32, {37, dim});
      cpu_->embedding(table, ints(id), ref);
      Tensor out = poisoned(DType::bf16, {37, dim});
      gpu_->embedding(table, gpu_->upload(ints(id)), out);
      expect_close(back(out), to_floats(ref), DType::bf16, "embedding");
    }
}

TEST_F(CudaOps, Matmul) {
  Rng rng("CudaOps.Matmul");
  struct Case {
    int64_t n, in, out;
  };
  // Decode sizes (GEMV, 1..8 tokens and a 9-token second pass), prefill sizes (cuBLASLt), odd sizes
  // (scalar GEMV path, unaligned rows), an 8B-model projection.
  const std::vector<Case> cases = {{1, 64, 64},   {3, 77, 131},   {8, 1000, 33}, {9, 256, 96},
                                   {64, 512, 384}, {300, 77, 50}, {1, 4096, 1024}, {133, 4096, 1024},
                                   // gemv_fast.cu (1 token, bf16): 2 whole 512-vector rounds + a tail; a tail only.
                                   {1, 8200, 7},   {1, 136, 5}};
  for (DType wt : {DType::f32, DType::bf16, DType::f16})
    for (const Case& c : cases)
      for (bool bias : {false, true})
        for (DType yt : {DType::bf16, DType::f32}) {
          SCOPED_TRACE(fmt::format("w={} n={} in={} out={} bias={} y={}", dtype_name(wt), c.n, c.in, c.out, bias,
                                   dtype_name(yt)));
          Weight w;
          w.w = rng.tensor(wt, {c.out, c.in}, 1.0f / std::sqrt(float(c.in)));
          if (bias) w.bias = rng.tensor(wt, {c.out}, 0.5f);
          Tensor x = act(rng, {c.n, c.in});
          Tensor ref = Tensor::host(DType::f32, {c.n, c.out});
          cpu_->matmul(x, w, ref);
          Tensor y = poisoned(yt, {c.n, c.out});
          gpu_->matmul(dev(x), w, y);
          expect_close(back(y), to_floats(ref), yt, "matmul");
        }
}

TEST_F(CudaOps, RmsNorm) {
  Rng rng("CudaOps.RmsNorm");
  for (DType wt : {DType::f32, DType::bf16, DType::f16})
    for (bool one_plus : {false, true})
      // Rows held in registers (up to 8 and 32 elements per thread) and, past that, the loop form.
      for (auto [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {5, 77}, {300, 4096}, {17, 16},
                                                                       {2, 9000}}) {
        SCOPED_TRACE(fmt::format("w={} one_plus={} rows={} dim={}", dtype_name(wt), one_plus, rows, dim));
        Tensor w = rng.tensor(wt, {dim});
        Tensor x = act(rng, {rows, dim}, 3.0f);
        Tensor ref = Tensor::host(DType::f32, {rows, dim});
        cpu_->rms_norm(x, w, 1e-6f, one_plus, ref);
        Tensor xd = dev(x), y = poisoned(DType::bf16, {rows, dim});
        gpu_->rms_norm(xd, w, 1e-6f, one_plus, y);
        expect_close(back(y), to_floats(ref), DType::bf16, "rms_norm");
        gpu_->rms_norm(xd, w, 1e-6f, one_plus, xd);  // in place
        expect_close(back(xd), to_floats(ref), DType::bf16, "rms_norm in place");
      }
}

TEST_F(CudaOps, Rope) {
  Rng rng("CudaOps.Rope");
  struct Case {
    int64_t n, heads, hd, half;
    int max_pos;
    float attn_factor;
  };
  // Full and partial rotary dims, long-context positions (angles far past 2π), yarn's attn factor.
  for (const Case& c : std::vector<Case>{{7, 4, 16, 8, 20, 1.0f}, {33, 32, 128, 64, 131000, 1.0f},
                                         {5, 3, 64, 16, 9000, 1.25f}, {1, 8, 256, 128, 4000, 1.0f}}) {
    SCOPED_TRACE(fmt::format("n={} heads={} hd={} half={}", c.n, c.heads, c.hd, c.half));
    Tensor inv = Tensor::host(DType::f32, {c.half});
    for (int64_t i = 0; i < c.half; ++i) inv.ptr<float>()[i] = std::pow(500000.0f, -float(2 * i) / float(2 * c.half));
    std::vector<int32_t> pos(c.n);
    for (auto& p : pos) p = static_cast<int32_t>(rng.uniform_int(0, c.max_pos));
    Tensor x = act(rng, {c.n, c.heads, c.hd});
    Tensor xd = dev(x);
    cpu_->rope(x, ints(pos), inv, c.attn_factor);
    gpu_->rope(xd, gpu_->upload(ints(pos)), gpu_->upload(inv), c.attn_factor);
    expect_close(back(xd), to_floats(x), DType::bf16, "rope");
  }
}

TEST_F(CudaOps, ElementwiseAndActivations) {
  Rng rng("CudaOps.Elementwise");
  for (int64_t n : {1, 77, 4096 * 3 + 5}) {
    SCOPED_TRACE(fmt::format("n={}", n));
    for (Activation a : {Activation::silu, Activation::gelu_tanh, Activation::gelu}) {
      Tensor g = act(rng, {n}, 4.0f), u = act(rng, {n}, 2.0f), ref = Tensor::host(DType::f32, {n});
      cpu_->gated_act(g, u, a, ref);
      Tensor gd = dev(g), out = poisoned(DType::bf16, {n});
      gpu_->gated_act(gd, dev(u), a, out);
      expect_close(back(out), to_floats(ref), DType::bf16, "gated_act");
      gpu_->gated_act(gd, dev(u), a, gd);  // out aliases gate
      expect_close(back(gd), to_floats(ref), DType::bf16, "gated_act in place");
    }
    for (DType t : {DType::bf16, DType::f32}) {
      Tensor a = act(rng, {n}), b = act(rng, {n}), ref = Tensor::host(DType::f32, {n});
      cpu_->add(a, b, ref);
      Tensor ad = dev(a, t), y = poisoned(t, {n});
      gpu_->add(ad, dev(b, t), y);
      expect_close(back(y), to_floats(ref), t, "add");
      gpu_->add(ad, dev(b, t), ad);
      expect_close(back(ad), to_floats(ref), t, "add in place");
      Tensor s = act(rng, {n}, 100.0f), sd = dev(s, t);
      cpu_->scale(s, 0.37f);
      gpu_->scale(sd, 0.37f);
      expect_close(back(sd), to_floats(s), t, "scale");
      Tensor c = act(rng, {n}, 100.0f), cd = dev(c, t);
      cpu_->softcap(c, 30.0f);
      gpu_->softcap(cd, 30.0f);
      expect_close(back(cd), to_floats(c), t, "softcap");
    }
  }
}

TEST_F(CudaOps, KvWriteGatherScatterArgmax) {
  Rng rng("CudaOps.RowOps");
  const int64_t n = 23, width = 96, n_slots = 64;
  std::vector<int32_t> slot(n);
  std::vector<int32_t> perm(n_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen());
  for (int64_t t = 0; t < n; ++t) slot[t] = t % 7 == 3 ? -1 : perm[t];  // -1: padding, not written
  Tensor k = act(rng, {n, width}), v = act(rng, {n, width});
  Tensor kc = act(rng, {n_slots, width}), vc = act(rng, {n_slots, width});
  Tensor kcd = dev(kc), vcd = dev(vc);
  cpu_->kv_write(k, v, ints(slot), kc, vc);
  gpu_->kv_write(dev(k), dev(v), gpu_->upload(ints(slot)), kcd, vcd);
  EXPECT_EQ(back(kcd), to_floats(kc));  // a copy: exact
  EXPECT_EQ(back(vcd), to_floats(vc));

  std::vector<int32_t> rows = {5, 0, 22, 5, 17};
  Tensor ref = Tensor::host(DType::f32, {5, width});
  cpu_->gather_rows(k, ints(rows), ref);
  Tensor out = poisoned(DType::bf16, {5, width});
  gpu_->gather_rows(dev(k), gpu_->upload(ints(rows)), out);
  EXPECT_EQ(back(out), to_floats(ref));
  // scatter_rows (KV blocks in and out): byte copies of rows of any width, 16-byte aligned (96 bf16)
  // and not (7 bf16).
  for (int64_t w : {width, int64_t{7}}) {
    std::vector<int32_t> to = {9, 2, 30};
    Tensor s = act(rng, {3, w}), d = act(rng, {40, w}), dd = dev(d);
    cpu_->scatter_rows(s, ints(to), d);
    gpu_->scatter_rows(dev(s), gpu_->upload(ints(to)), dd);
    EXPECT_EQ(back(dd), to_floats(d)) << "width " << w;
  }

  // Repeated destination rows (a token routed to several experts).
  std::vector<int32_t> dst_rows = {3, 1, 3, 0, 3};
  Tensor wts = Tensor::host(DType::f32, {5});
  for (int i = 0; i < 5; ++i) wts.ptr<float>()[i] = rng.uniform(0.0f, 1.0f);
  Tensor src = act(rng, {5, width}), dst = act(rng, {4, width}), dstd = dev(dst);
  cpu_->scatter_add_rows(src, ints(dst_rows), wts, dst);
  gpu_->scatter_add_rows(dev(src), gpu_->upload(ints(dst_rows)), gpu_->upload(wts), dstd);
  expect_close(back(dstd), to_floats(dst), DType::bf16, "scatter_add_rows");

  // Few rows of many columns are split over blocks (argmax_splits); rows 7 and 8 tie across splits
  // (the first index wins) and are constant (index 0).
  for (int64_t cols : {10, 512, 152064}) {
    Tensor lg = act(rng, {9, cols}, 10.0f, DType::f32);
    float* r7 = lg.ptr<float>() + 7 * cols;
    r7[cols - 1] = r7[cols / 2] = r7[cols / 3] = 100.0f;
    std::fill(lg.ptr<float>() + 8 * cols, lg.ptr<float>() + 9 * cols, -1.0f);
    std::vector<int32_t> want(9);
    for (int r = 0; r < 9; ++r)
      want[r] = static_cast<int32_t>(std::max_element(lg.ptr<float>() + r * cols, lg.ptr<float>() + (r + 1) * cols) -
                                     (lg.ptr<float>() + r * cols));
    Tensor ids = gpu_->alloc(DType::i32, {9});
    gpu_->argmax_rows(dev(lg, DType::f32), ids);
    Tensor h = gpu_->to_host(ids);
    EXPECT_EQ(std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + 9), want) << "argmax over " << cols;
  }
}

// ---- attention over the paged cache

struct Seq {
  int64_t len, n_query;  // cached tokens after this step; this step's tokens are the last n_query
};

class CudaAttention : public CudaOps {
 public:
  using CudaOps::as_bf16;
  using CudaOps::dev;
  using CudaOps::ints;
  using CudaOps::poisoned;
  using CudaOps::back;
  Backend& gpu() { return *gpu_; }
  Backend& cpu() { return *cpu_; }
  void set_kernel(int k) {
#ifdef KILN_HAVE_CUDA
    static_cast<cuda::CudaBackend&>(*gpu_).set_attention_kernel(static_cast<cuda::AttnKernel>(k));
#endif
  }
  // sink > 0: the rotating cache's first keys besides the window; the blocks no query token of a
  // sequence sees then point at a spare block (random rows the CPU reference never reads).
  void check(Rng& rng, const std::vector<Seq>& seqs, int gqa, int hd, int window, float softcap, int bs, bool shuffle,
             int n_kv_heads = 2, int sink = 0, const KvQuant& quant = {});
};

// A quantized cache of the rows of f32 cache c [n_blocks, bs, width] (quantize_kv_row per row), on the host.
KvTensor quantized_host(const Tensor& c, const KvQuant& q) {
  const int64_t width = c.dim(2);
  KvTensor t = make_kv_tensor([](DType d, Shape s) { return Tensor::host(d, std::move(s)); }, q, c.dim(0), c.dim(1),
                              width, DType::f32);
  const int64_t words = width * q.bits / 32, groups = width / q.group_size;
  for (int64_t r = 0; r < c.rows(); ++r)
    quantize_kv_row(c.ptr<float>() + r * width, width, q, t.data.ptr<uint32_t>() + r * words,
                    t.scales.ptr<uint16_t>() + r * groups, t.biases.ptr<uint16_t>() + r * groups);
  return t;
}
KvTensor upload_kv(Backend& be, const KvTensor& h) {
  KvTensor d = h;
  d.data = be.upload(h.data);
  d.scales = be.upload(h.scales);
  d.biases = be.upload(h.biases);
  return d;
}

void CudaAttention::check(Rng& rng, const std::vector<Seq>& seqs, int gqa, int hd, int window, float softcap, int bs,
                          bool shuffle, int n_kv_heads, int sink, const KvQuant& quant) {
  AttnParams p;
  p.n_kv_heads = n_kv_heads;
  p.n_heads = n_kv_heads * gqa;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(float(hd));
  p.softcap = softcap;
  p.window = window;
  p.sink = sink;
  p.block_size = bs;
  const int64_t kv_width = int64_t{p.n_kv_heads} * hd, q_width = int64_t{p.n_heads} * hd;
  int64_t need = 0, max_blocks = 0;
  for (const Seq& s : seqs) {
    need += (s.len + bs - 1) / bs;
    max_blocks = std::max(max_blocks, (s.len + bs - 1) / bs);
  }
  p.max_blocks = static_cast<int>(max_blocks + 1);
  const int64_t n_blocks = need + 2;
  std::vector<int32_t> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen());
  std::vector<int32_t> tables(seqs.size() * p.max_blocks, -1);
  int64_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t b = 0; b < (seqs[s].len + bs - 1) / bs; ++b) tables[s * p.max_blocks + b] = perm[next++];
  if (sink > 0 && window > 0)
    for (size_t s = 0; s < seqs.size(); ++s) {
      std::vector<bool> seen((seqs[s].len + bs - 1) / bs, false);
      for (int64_t j = seqs[s].len - seqs[s].n_query; j < seqs[s].len; ++j) {
        const int64_t lo = std::max<int64_t>(0, j - window + 1);
        for (int64_t k = 0; k < std::min<int64_t>(sink, lo); ++k) seen[k / bs] = true;
        for (int64_t k = lo; k <= j; ++k) seen[k / bs] = true;
      }
      for (size_t b = 0; b < seen.size(); ++b)
        if (!seen[b]) tables[s * p.max_blocks + b] = perm[n_blocks - 1];
    }
  // Cache contents: random everywhere (also rows no sequence owns); tokens: each sequence's queries.
  Tensor kc = act(rng, {n_blocks, bs, kv_width}), vc = act(rng, {n_blocks, bs, kv_width});
  std::vector<int32_t> tseq, tpos;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t j = seqs[s].len - seqs[s].n_query; j < seqs[s].len; ++j) tseq.push_back(int32_t(s)), tpos.push_back(int32_t(j));
  if (shuffle) {  // tokens of different sequences interleaved: the semantics do not need them grouped
    std::vector<size_t> order(tseq.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng.gen());
    std::vector<int32_t> a(tseq.size()), b(tseq.size());
    for (size_t i = 0; i < order.size(); ++i) a[i] = tseq[order[i]], b[i] = tpos[order[i]];
    tseq = a, tpos = b;
  }
  const int64_t n = static_cast<int64_t>(tseq.size());
  Tensor q = act(rng, {n, q_width}, 2.0f);
  Tensor ref = Tensor::host(DType::f32, {n, q_width});
  // A quantized cache: the same codes on both sides (the CPU reads them as the GPU must).
  const KvTensor kq = quant.on() ? quantized_host(kc, quant) : KvTensor(kc), vq = quant.on() ? quantized_host(vc, quant) : KvTensor(vc);
  cpu().attention(q, kq, vq, ints(tables), ints(tseq), ints(tpos), p, ref);
  const KvTensor kcd = quant.on() ? upload_kv(gpu(), kq) : KvTensor(dev(kc)), vcd = quant.on() ? upload_kv(gpu(), vq) : KvTensor(dev(vc));
  Tensor qd = dev(q), bt = gpu().upload(ints(tables)), ts = gpu().upload(ints(tseq)), tp = gpu().upload(ints(tpos));
  for (int kernel : {1, 2}) {  // decode (split-K), prefill (tensor cores) where head_dim allows
    set_kernel(kernel);
    Tensor out = poisoned(DType::bf16, {n, q_width});
    gpu().attention(qd, kcd, vcd, bt, ts, tp, p, out);
    expect_close(back(out), to_floats(ref), DType::bf16, kernel == 1 ? "attention decode kernel" : "attention prefill kernel");
  }
  set_kernel(0);
}

TEST_F(CudaAttention, RaggedBatchesWindowsSoftcapGqa) {
  Rng rng("CudaAttention.Ragged");
  // First token, decode at several lengths, a whole prompt, a chunk of a prompt, odd lengths.
  const std::vector<Seq> mixed = {{1, 1}, {70, 1}, {7, 7}, {33, 5}, {20, 3}, {129, 64}, {5, 1}};
  for (int gqa : {1, 4, 8})
    for (int hd : {16, 64, 128, 256})
      for (int window : {0, 37})
        for (float softcap : {0.0f, 30.0f}) {
          SCOPED_TRACE(fmt::format("gqa={} head_dim={} window={} softcap={}", gqa, hd, window, softcap));
          check(rng, mixed, gqa, hd, window, softcap, 16, false);
        }
  SCOPED_TRACE("interleaved tokens");
  check(rng, mixed, 4, 128, 0, 0.0f, 16, true);
}

TEST_F(CudaAttention, LongContexts) {
  Rng rng("CudaAttention.Long");
  // Decode at 5000 and 20000 tokens (many splits), a 300-token chunk late in a 3000-token prompt,
  // and a batch of 48 decoding sequences of different lengths.
  check(rng, {{5000, 1}, {20000, 1}}, 4, 128, 0, 0.0f, 16, false);
  check(rng, {{3000, 300}}, 4, 128, 0, 0.0f, 16, false);
  check(rng, {{3000, 300}}, 2, 64, 1024, 50.0f, 32, false);
  std::vector<Seq> many;
  for (int i = 0; i < 48; ++i) many.push_back({1 + (i * 97) % 900, 1});
  check(rng, many, 4, 128, 0, 0.0f, 16, false);
  check(rng, many, 8, 128, 256, 0.0f, 16, false);
}

TEST_F(CudaAttention, DecodeGroupsAndBatches) {
  Rng rng("CudaAttention.Decode");
  // The tiled decode kernel (head_dim 64/128/256) over GQA groups of 1..16: 7 and 12 are not powers
  // of two (a block computes unused heads), 12 and 16 run in two chunks of heads. 4 kv heads: a
  // batch of 1 makes 4 (token, kv head) blocks, so the split heuristic cuts its 200-token context
  // into several splits (partials + combine); a batch of 128 makes 512 blocks, over two per SM on
  // any current GPU, so one split writes the output directly. Short contexts of every tile fill.
  std::vector<Seq> batch128;
  for (int i = 0; i < 128; ++i) batch128.push_back({1 + (i * 37) % 61, 1});
  for (int hd : {64, 128, 256})
    for (int gqa : {1, 2, 4, 7, 8, 12, 16}) {
      SCOPED_TRACE(fmt::format("head_dim={} gqa={}", hd, gqa));
      check(rng, {{200, 1}}, gqa, hd, 0, 0.0f, 16, false, 4);
      check(rng, batch128, gqa, hd, gqa == 7 ? 20 : 0, gqa == 8 ? 30.0f : 0.0f, 16, true, 4);
    }
  // Small batches where a sequence brings several query tokens (speculative verification, a prompt's
  // last chunk): the latency form (grids of <= 1 block per SM) requests the keys before the
  // sequence's first position in the step ahead of the PDL wait, the others after it.
  for (int hd : {64, 128}) {
    SCOPED_TRACE(fmt::format("several tokens per sequence, head_dim={}", hd));
    check(rng, {{150, 5}, {60, 3}, {1, 1}}, 4, hd, 0, 0.0f, 16, true);
    check(rng, {{150, 5}, {60, 3}}, 8, hd, 37, 30.0f, 16, false);
  }
  // Batch 1 deep into a long context with a window and softcap: splits start at pos - window + 1,
  // the last one partly filled; blocks of 32 rows.
  for (int hd : {128, 256}) {
    SCOPED_TRACE(fmt::format("window, head_dim={}", hd));
    check(rng, {{2500, 1}}, 7, hd, 700, 50.0f, 32, false, 4);
  }
}

TEST_F(CudaAttention, PrefillGroupsAndRaggedTiles) {
  Rng rng("CudaAttention.PrefillGroups");
  // The prefill kernel packs GQA heads into its 128-row tiles (group 4: 32 tokens x 4 heads; 7: one
  // head; 8 and 16: 8 heads, 16 in two chunks; 12: 4 heads, three chunks). Whole prompts, chunks of
  // prompts and decode rows of several sequences share tiles: in order (a tile holds the end of one
  // sequence and the start of the next) and interleaved (every tile mixes sequences: one pass each).
  // Windows cut rows' ranges inside tiles and make the warps skip whole tiles; a softcap switches
  // the kernel variant. Lengths are odd so that the last tile of every range is partly filled.
  const std::vector<Seq> ragged = {{45, 45}, {77, 77}, {5, 5}, {150, 30}, {301, 99}, {64, 1}, {33, 17}};
  for (int gqa : {1, 4, 7, 8})
    for (int hd : {32, 64, 128}) {
      SCOPED_TRACE(fmt::format("gqa={} head_dim={}", gqa, hd));
      check(rng, ragged, gqa, hd, 0, 0.0f, 16, false);
      check(rng, ragged, gqa, hd, 50, 30.0f, 16, true);
    }
  for (int gqa : {12, 16}) {
    SCOPED_TRACE(fmt::format("chunked group {}", gqa));
    check(rng, ragged, gqa, 64, 0, 0.0f, 16, true, 1);
  }
}

// The rotating cache (--max-kv-size): sink keys before the window, for decodes (split-K over the
// sink then the window: the splits' virtual key runs) and prefill rows (the extra sink pass per
// sequence), windows that still reach the sink, blocks smaller than the sink, and the blocks no
// token sees pointing elsewhere.
TEST_F(CudaAttention, RotatingSinkAndWindow) {
  Rng rng("CudaAttention.Rotating");
  const std::vector<Seq> mixed = {{1, 1}, {70, 1}, {9, 9}, {300, 100}, {2000, 1}, {130, 2}, {45, 45}};
  for (int gqa : {1, 4, 8})
    for (int hd : {16, 64, 128, 256})
      for (int window : {20, 60})
        for (int sink : {4, 7}) {
          SCOPED_TRACE(fmt::format("gqa={} head_dim={} window={} sink={}", gqa, hd, window, sink));
          check(rng, mixed, gqa, hd, window, 0.0f, 16, false, 2, sink);
        }
  SCOPED_TRACE("blocks of 4, interleaved tokens, softcap");
  check(rng, mixed, 4, 128, 60, 30.0f, 4, true, 2, 4);
  check(rng, {{5000, 1}, {3000, 300}}, 4, 128, 1020, 0.0f, 16, false, 2, 4);
}

// Quantized caches (8 and 4 bits): the quantized decode kernel (head_dim 64/128), the generic one
// (head_dim 16) and the prefill kernel's dequantizing tile loads against the CPU over the same
// codes; GQA 1/4/8, windows (with sink keys too), softcap, ragged batches, groups of 32 and 64, a long decode (splits +
// combine) and a long prefill.
TEST_F(CudaAttention, QuantizedCaches) {
  Rng rng("CudaAttention.Quantized");
  const std::vector<Seq> mixed = {{1, 1}, {70, 1}, {7, 7}, {33, 5}, {129, 64}, {5, 1}};
  for (int bits : {8, 4})
    for (int hd : {16, 64, 128})
      for (int gqa : {1, 4, 8}) {
        const KvQuant q = resolve_kv_quant(bits, 64, hd);
        SCOPED_TRACE(fmt::format("bits={} group={} head_dim={} gqa={}", bits, q.group_size, hd, gqa));
        check(rng, mixed, gqa, hd, 0, 0.0f, 16, false, 2, 0, q);
        check(rng, mixed, gqa, hd, 37, 30.0f, 16, true, 2, 0, q);
        check(rng, mixed, gqa, hd, 20, 0.0f, 16, false, 2, 4, q);  // the rotating cache's sink keys
      }
  for (int bits : {8, 4}) {
    SCOPED_TRACE(fmt::format("long, bits={}", bits));
    check(rng, {{5000, 1}, {900, 1}}, 4, 128, 0, 0.0f, 16, false, 2, 0, {bits, 64});
    check(rng, {{2048, 2048}}, 4, 128, 0, 0.0f, 16, false, 1, 0, {bits, 32});
  }
}

// kv_write into a quantized cache: codes, scales and biases equal the CPU's (one rule, IEEE f32
// arithmetic on both), padding slots skipped; rope_kv_write takes the same path.
TEST_F(CudaOps, QuantizedKvWrite) {
  Rng rng("CudaOps.QuantizedKvWrite");
  for (int bits : {8, 4})
    for (int group : {32, 64}) {
      SCOPED_TRACE(fmt::format("bits={} group={}", bits, group));
      const KvQuant q{bits, group};
      const int64_t width = 256, n_blocks = 3, bs = 4;
      const std::vector<int32_t> slot = {7, -1, 0, 11, 3};
      Tensor k = act(rng, {5, width}, 3.0f), v = act(rng, {5, width});
      auto host_alloc = [](DType d, Shape s) { return Tensor::host(d, std::move(s)); };
      KvTensor kc = make_kv_tensor(host_alloc, q, n_blocks, bs, width, DType::f32), vc = kc;
      vc = make_kv_tensor(host_alloc, q, n_blocks, bs, width, DType::f32);
      cpu_->kv_write(k, v, ints(slot), kc, vc);
      KvTensor kcd = upload_kv(*gpu_, make_kv_tensor(host_alloc, q, n_blocks, bs, width, DType::f32));
      KvTensor vcd = upload_kv(*gpu_, make_kv_tensor(host_alloc, q, n_blocks, bs, width, DType::f32));
      gpu_->kv_write(dev(k), dev(v), gpu_->upload(ints(slot)), kcd, vcd);
      for (auto [h, d] : {std::pair{&kc, &kcd}, std::pair{&vc, &vcd}}) {
        for (auto [ht, dt] : {std::pair{&h->data, &d->data}, std::pair{&h->scales, &d->scales}, std::pair{&h->biases, &d->biases}}) {
          const Tensor back_t = gpu_->to_host(*dt);
          ASSERT_EQ(back_t.nbytes(), ht->nbytes());
          EXPECT_EQ(std::memcmp(back_t.data, ht->data, ht->nbytes()), 0) << "plane " << dtype_name(ht->dtype);
        }
      }
    }
}

TEST_F(CudaAttention, PrefillLongPrompts) {
  Rng rng("CudaAttention.PrefillLong");
  // Whole prompts of 2k-8k tokens (one kv head keeps the CPU reference to a few GFLOP): hundreds of
  // K/V tiles through the double buffer and the online softmax, causal tails per warp; an 8k prompt
  // with a window (most tiles skipped, the range starts mid-tile); a late chunk of a long prompt with
  // GQA 8 and blocks of 32 rows.
  check(rng, {{2048, 2048}}, 4, 128, 0, 0.0f, 16, false, 1);
  check(rng, {{8192, 8192}}, 1, 64, 0, 0.0f, 16, false, 1);
  check(rng, {{8192, 8192}}, 4, 128, 1000, 0.0f, 16, false, 1);
  check(rng, {{3001, 3001}}, 7, 32, 0, 50.0f, 16, false, 1);
  check(rng, {{5000, 250}}, 8, 128, 0, 0.0f, 32, false, 1);
}


// ---- fused ops (cuda_fused_ops.cpp): each against the CPU's default (the separate ops), and
// bit for bit against the separate CUDA ops it replaces (the fused kernels share their math).

#ifdef KILN_HAVE_CUDA
// The ops that ran on a profiling backend (KILN_CUDA_PROFILE=1 times every op by name), so a test
// can tell the fused launch from a silent fallback to the separate ops.
std::unique_ptr<Backend> profiling_backend() {
  setenv("KILN_CUDA_PROFILE", "1", 1);
  auto be = make_cuda_backend(0);
  unsetenv("KILN_CUDA_PROFILE");
  return be;
}
std::string profile_of(Backend& be) { return static_cast<cuda::CudaBackend&>(be).profile_report(); }
#endif

TEST_F(CudaOps, FusedAddRmsNorm) {
  Rng rng("CudaOps.FusedAddRmsNorm");
  for (DType wt : {DType::f32, DType::bf16})
    for (DType xt : {DType::bf16, DType::f32})
      for (bool one_plus : {false, true})
        for (auto [rows, dim] :
             std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {5, 77}, {3, 4096}, {17, 16}, {9, 300}, {2, 9000}}) {
          SCOPED_TRACE(fmt::format("w={} x={} one_plus={} rows={} dim={}", dtype_name(wt), dtype_name(xt), one_plus,
                                   rows, dim));
          Tensor w = rng.tensor(wt, {dim});
          Tensor x = act(rng, {rows, dim}, 3.0f), delta = act(rng, {rows, dim}, 2.0f);
          Tensor xd = dev(x, xt), dd = dev(delta, xt), xs = dev(x, xt), xa = dev(x, xt), da = dev(delta, xt);
          Tensor ref = Tensor::host(DType::f32, {rows, dim});
          cpu_->add_rms_norm(x, delta, w, 1e-6f, one_plus, ref);  // x becomes x + delta
          Tensor y = poisoned(xt, {rows, dim});
          gpu_->add_rms_norm(xd, dd, w, 1e-6f, one_plus, y);
          expect_close(back(xd), to_floats(x), xt, "add_rms_norm x");
          expect_close(back(y), to_floats(ref), xt, "add_rms_norm y");
          // The separate CUDA ops: the same stored x and the norm of it, exactly.
          Tensor ys = poisoned(xt, {rows, dim});
          gpu_->add(xs, dd, xs);
          gpu_->rms_norm(xs, w, 1e-6f, one_plus, ys);
          EXPECT_EQ(back(xd), back(xs)) << "add_rms_norm x vs add";
          EXPECT_EQ(back(y), back(ys)) << "add_rms_norm y vs add + rms_norm";
          // y aliasing delta (the model passes the block output as delta and may reuse it).
          gpu_->add_rms_norm(xa, da, w, 1e-6f, one_plus, da);
          EXPECT_EQ(back(da), back(ys)) << "add_rms_norm with y = delta";
          EXPECT_EQ(back(xa), back(xs)) << "add_rms_norm x with y = delta";
        }
}

TEST_F(CudaOps, FusedRopeKvWrite) {
  Rng rng("CudaOps.FusedRopeKvWrite");
  struct Case {
    int64_t n, heads, kv_heads, hd, half;
    int max_pos;
    float attn_factor;
  };
  // Decode (one token) and prefill-sized rows, GQA, head_dim 64/128, partial rotary (phi-style),
  // long positions, yarn's attn factor.
  for (const Case& c : std::vector<Case>{{1, 32, 8, 128, 64, 5000, 1.0f},
                                         {7, 4, 2, 64, 32, 20, 1.0f},
                                         {23, 12, 4, 128, 32, 131000, 1.25f},
                                         {5, 6, 6, 64, 16, 900, 1.0f},
                                         {3, 2, 1, 80, 40, 77, 1.0f}}) {
    SCOPED_TRACE(fmt::format("n={} heads={} kv_heads={} hd={} half={}", c.n, c.heads, c.kv_heads, c.hd, c.half));
    const int64_t width = c.kv_heads * c.hd, n_slots = c.n + 17;
    Tensor inv = Tensor::host(DType::f32, {c.half});
    for (int64_t i = 0; i < c.half; ++i) inv.ptr<float>()[i] = std::pow(500000.0f, -float(2 * i) / float(2 * c.half));
    std::vector<int32_t> pos(c.n), slot(c.n), perm(n_slots);
    for (auto& p : pos) p = static_cast<int32_t>(rng.uniform_int(0, c.max_pos));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.gen());
    for (int64_t t = 0; t < c.n; ++t) slot[t] = (t % 5 == 2) ? -1 : perm[t];  // -1: padding, not written
    Tensor q = act(rng, {c.n, c.heads, c.hd}), k = act(rng, {c.n, c.kv_heads, c.hd}), v = act(rng, {c.n, width});
    Tensor kc = act(rng, {n_slots, width}), vc = act(rng, {n_slots, width});
    Tensor qd = dev(q), kd = dev(k), vd = dev(v), kcd = dev(kc), vcd = dev(vc);
    Tensor qs = dev(q), ks = dev(k), kcs = dev(kc), vcs = dev(vc);
    Tensor posd = gpu_->upload(ints(pos)), slotd = gpu_->upload(ints(slot)), invd = gpu_->upload(inv);
    cpu_->rope_kv_write(q, k, v, ints(pos), inv, c.attn_factor, ints(slot), kc, vc);
    gpu_->rope_kv_write(qd, kd, vd, posd, invd, c.attn_factor, slotd, kcd, vcd);
    expect_close(back(qd), to_floats(q), DType::bf16, "rope_kv_write q");
    expect_close(back(kd), to_floats(k), DType::bf16, "rope_kv_write k");
    expect_close(back(kcd), to_floats(kc), DType::bf16, "rope_kv_write k_cache");
    EXPECT_EQ(back(vcd), to_floats(vc)) << "v_cache: a copy, exact";
    // The separate CUDA ops, bit for bit.
    gpu_->rope(qs, posd, invd, c.attn_factor);
    gpu_->rope(ks, posd, invd, c.attn_factor);
    gpu_->kv_write(ks.view({c.n, width}), vd, slotd, kcs, vcs);
    EXPECT_EQ(back(qd), back(qs)) << "q vs rope";
    EXPECT_EQ(back(kd), back(ks)) << "k vs rope";
    EXPECT_EQ(back(kcd), back(kcs)) << "k_cache vs rope + kv_write";
    EXPECT_EQ(back(vcd), back(vcs)) << "v_cache vs kv_write";
  }
}

TEST_F(CudaOps, FusedMatmulMulti) {
  Rng rng("CudaOps.FusedMatmulMulti");
  struct Case {
    int64_t n, in;
    std::vector<int64_t> outs;
    DType wt;
  };
  // One token of bf16 (the one-launch path): q/k/v of an 8B layer, gate/up, odd row counts with a
  // tail-only input, 4 matrices. Then the loop: several tokens, f32 weights, an input of in % 8 != 0.
  const std::vector<Case> cases = {{1, 4096, {4096, 1024, 1024}, DType::bf16}, {1, 512, {1408, 1408}, DType::bf16},
                                   {1, 136, {5, 77, 13}, DType::bf16},         {1, 8200, {7, 3, 9, 2}, DType::bf16},
                                   {3, 256, {96, 33, 33}, DType::bf16},        {1, 256, {64, 31, 31}, DType::f32},
                                   {1, 77, {12, 5, 5}, DType::bf16}};
  for (const Case& c : cases)
    for (DType yt : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(fmt::format("n={} in={} outs={} w={} y={}", c.n, c.in, c.outs.size(), dtype_name(c.wt),
                               dtype_name(yt)));
      const size_t m = c.outs.size();
      std::vector<Weight> w(m);
      for (size_t i = 0; i < m; ++i) {
        w[i].w = rng.tensor(c.wt, {c.outs[i], c.in}, 1.0f / std::sqrt(float(c.in)));
        if (i % 2 == 0) w[i].bias = rng.tensor(i == 0 ? DType::bf16 : DType::f32, {c.outs[i]}, 0.5f);  // biases of both dtypes
      }
      Tensor x = act(rng, {c.n, c.in});
      Tensor xd = dev(x);
      std::vector<Tensor> ref(m), y(m), ys(m);
      std::vector<const Weight*> wp(m);
      std::vector<Tensor*> rp(m), yp(m);
      for (size_t i = 0; i < m; ++i) {
        ref[i] = Tensor::host(DType::f32, {c.n, c.outs[i]});
        y[i] = poisoned(yt, {c.n, c.outs[i]});
        wp[i] = &w[i], rp[i] = &ref[i], yp[i] = &y[i];
      }
      cpu_->matmul_multi(x, wp, rp);
      gpu_->matmul_multi(xd, wp, yp);
      for (size_t i = 0; i < m; ++i) {
        Tensor single = Tensor::host(DType::f32, {c.n, c.outs[i]});
        cpu_->matmul(x, w[i], single);
        EXPECT_EQ(to_floats(ref[i]), to_floats(single)) << "cpu default vs matmul, matrix " << i;
        expect_close(back(y[i]), to_floats(ref[i]), yt, fmt::format("matmul_multi matrix {}", i));
        ys[i] = poisoned(yt, {c.n, c.outs[i]});
        gpu_->matmul(xd, w[i], ys[i]);
        EXPECT_EQ(back(y[i]), back(ys[i])) << "vs the CUDA matmul, matrix " << i;
      }
    }
}

#ifdef KILN_HAVE_CUDA
// The per-step arena grows to what an overflowing step needed in one go, counting the tensors
// allocated while an overflowed one was alive: the same step then runs without an overflow or an
// allocation. (Sized from the records that fit only, the second step overflowed again.)
TEST_F(CudaOps, ArenaGrowsToAStepsNeedAtOnce) {
  auto be = make_cuda_backend(0);
  auto& cb = static_cast<cuda::CudaBackend&>(*be);
  const auto step = [&] {
    be->begin_step();
    {
      Tensor a = be->alloc(DType::f32, {1 << 20});  // 4 MB
      Tensor b = be->alloc(DType::f32, {32 << 20});  // 128 MB: past the 64 MB first arena
      Tensor c = be->alloc(DType::f32, {16 << 20});  // 64 MB each while b lives
      Tensor d = be->alloc(DType::f32, {16 << 20});
      for (Tensor* t : {&a, &b, &c, &d}) be->fill_zero(*t);
      Tensor h = be->to_host(d);
      EXPECT_EQ(h.ptr<float>()[(16 << 20) - 1], 0.0f);
    }
    be->end_step();
  };
  const int64_t o0 = cb.stats().arena_overflows;
  step();
  const int64_t o1 = cb.stats().arena_overflows;
  EXPECT_GT(o1, o0) << "the first step should not fit the first arena";
  step();  // grows the arena at its start
  EXPECT_EQ(cb.stats().arena_overflows, o1) << "the step overflowed again after the arena grew";
  const int64_t m2 = cb.stats().device_mallocs;
  step();
  EXPECT_EQ(cb.stats().device_mallocs, m2);
}

// Each fused op really is one fused launch (not the default's separate ops) on decode shapes.
TEST_F(CudaOps, FusedOpsLaunchFused) {
  Rng rng("CudaOps.FusedOpsLaunchFused");
  auto be = profiling_backend();
  const int64_t in = 256, hd = 64;
  std::vector<Weight> w(3);
  for (int i = 0; i < 3; ++i) w[i].w = rng.tensor(DType::bf16, {i == 0 ? 256 : 64, in}, 0.1f);
  Tensor x = be->upload(as_bf16(act(rng, {1, in})));
  Tensor q = be->alloc(DType::bf16, {1, 256}), k = be->alloc(DType::bf16, {1, 64}), v = be->alloc(DType::bf16, {1, 64});
  std::vector<const Weight*> wp = {&w[0], &w[1], &w[2]};
  std::vector<Tensor*> yp = {&q, &k, &v};
  be->matmul_multi(x, wp, yp);
  Tensor inv = Tensor::host(DType::f32, {hd / 2});
  for (int64_t i = 0; i < hd / 2; ++i) inv.ptr<float>()[i] = std::pow(10000.0f, -float(2 * i) / float(hd));
  Tensor kc = be->upload(as_bf16(act(rng, {4, 64}))), vc = be->upload(as_bf16(act(rng, {4, 64})));
  Tensor q3 = q.view({1, 4, hd}), k3 = k.view({1, 1, hd});
  be->rope_kv_write(q3, k3, v, be->upload(ints({3})), be->upload(inv), 1.0f, be->upload(ints({2})), kc, vc);
  Tensor nw = rng.tensor(DType::bf16, {256}), h = be->alloc(DType::bf16, {1, 256});
  Tensor r = be->upload(as_bf16(act(rng, {1, 256})));
  be->add_rms_norm(r, q, nw, 1e-5f, false, h);
  be->to_host(h);  // flushes the profile
  const std::string prof = profile_of(*be);
  for (const char* op : {"matmul_multi (gemv)", "rope_kv_write", "add_rms_norm"})
    EXPECT_NE(prof.find(op), std::string::npos) << op << " missing from\n" << prof;
  for (const char* op : {"matmul (gemv)", "rope ", "kv_write ", "rms_norm ", "add "})
    EXPECT_EQ(prof.find(std::string("\n") + op), std::string::npos) << op << " ran separately:\n" << prof;
}
#endif


// ---- MoE (moe_route, moe_experts): the device path against the CPU's host-routing defaults.
namespace moe {

using cpu::test::Experts;
using cpu::test::random_experts;


// Router logits as bf16 values (what the CUDA router matmul writes), on a coarse grid when `ties`.
Tensor logits(Rng& rng, int64_t n, int64_t n_experts, bool ties) {
  Tensor f = rng.tensor(DType::bf16, {n, n_experts}, 4.0f);
  Tensor r = Tensor::host(DType::f32, f.shape);
  to_f32(f.data, f.dtype, r.ptr<float>(), f.numel());
  if (ties)
    for (int64_t i = 0; i < r.numel(); ++i) r.ptr<float>()[i] = std::round(r.ptr<float>()[i]);
  return r;
}

std::vector<int32_t> int_values(const Tensor& host) {
  return std::vector<int32_t>(host.ptr<int32_t>(), host.ptr<int32_t>() + host.numel());
}

}  // namespace moe

TEST_F(CudaOps, MoeRoute) {
  Rng rng("CudaOps.MoeRoute");
  for (int64_t n_experts : {8, 16, 128})
    for (int k : {2, 4})
      for (bool norm : {false, true})
        for (bool ties : {false, true})
          for (int64_t n : {1, 2, 3, 5, 8, 13, 16, 40}) {
            const DType lt = n == 3 ? DType::f32 : DType::bf16;  // the device logits' dtype
            SCOPED_TRACE(fmt::format("E={} k={} norm={} ties={} n={} logits={}", n_experts, k, norm, ties, n,
                                     dtype_name(lt)));
            Tensor l = moe::logits(rng, n, n_experts, ties);
            Tensor ids = Tensor::host(DType::i32, {n, k}), w = Tensor::host(DType::f32, {n, k});
            cpu_->moe_route(l, k, norm, ids, w);
            Tensor idsd = poisoned(DType::i32, {n, k}), wd = poisoned(DType::f32, {n, k});
            gpu_->moe_route(dev(l, lt), k, norm, idsd, wd);
            // The same logit values: the same experts in the same order (ties to the lower index).
            ASSERT_EQ(moe::int_values(gpu_->to_host(idsd)), moe::int_values(ids));
            const std::vector<float> got = back(wd), want = to_floats(w);
            for (size_t i = 0; i < want.size(); ++i)
              ASSERT_NEAR(got[i], want[i], 1e-5) << "weight " << i << " (f32 softmax vs the CPU's double)";
          }
}

TEST_F(CudaOps, MoeExperts) {
  Rng rng("CudaOps.MoeExperts");
  struct Case {
    int64_t n_experts, k, dim, ffn;
    DType wt;
  };
  // bf16 experts (16-byte loads), f32 (mixtral's tiny model) and f16 weights, a qwen3-30B-like
  // expert (dim 2048, ffn 768), and ffn % 8 != 0 (element loads).
  const std::vector<Case> cases = {{8, 2, 64, 32, DType::bf16},   {16, 4, 256, 96, DType::bf16},
                                   {8, 2, 64, 32, DType::f32},    {16, 4, 128, 40, DType::bf16},
                                   {8, 4, 96, 64, DType::f16},    {8, 2, 2048, 768, DType::bf16}};
  for (const Case& c : cases) {
    moe::Experts ex = moe::random_experts(rng, c.wt, c.n_experts, c.dim, c.ffn);
    const auto refs = ex.refs();
    for (int64_t n : {1, 2, 5, 8, 16, 17}) {
      for (Activation a : {Activation::silu, Activation::gelu_tanh}) {
        if (a == Activation::gelu_tanh && n != 5) continue;
        SCOPED_TRACE(fmt::format("E={} k={} dim={} ffn={} w={} n={} act={}", c.n_experts, c.k, c.dim, c.ffn,
                                 dtype_name(c.wt), n, int(a)));
        EXPECT_EQ(gpu_->moe_on_device(refs, n), n <= 16) << "dense experts take the device path up to 16 tokens";
        Tensor x = act(rng, {n, c.dim});
        Tensor ids = Tensor::host(DType::i32, {n, c.k}), w = Tensor::host(DType::f32, {n, c.k});
        cpu_->moe_route(moe::logits(rng, n, c.n_experts, false), int(c.k), true, ids, w);
        Tensor ref = Tensor::host(DType::f32, {n, c.dim});
        cpu_->moe_experts(x, refs, a, ids, w, ref);
        Tensor xd = dev(x), idsd = gpu_->upload(ids), wd = gpu_->upload(w);
        for (DType ot : {DType::bf16, DType::f32}) {
          if (ot == DType::f32 && n != 2) continue;
          Tensor out = poisoned(ot, {n, c.dim});
          gpu_->moe_experts(xd, refs, a, idsd, wd, out);
          expect_close(back(out), to_floats(ref), DType::bf16, fmt::format("moe_experts out={}", dtype_name(ot)));
        }
        // The CUDA host default (per-expert gather + matmuls + scatter): the same values up to
        // summation order.
        Tensor out = poisoned(DType::bf16, {n, c.dim}), dflt = poisoned(DType::bf16, {n, c.dim});
        gpu_->moe_experts(xd, refs, a, idsd, wd, out);
        gpu_->Backend::moe_experts(xd, refs, a, idsd, wd, dflt);
        expect_close(back(out), back(dflt), DType::bf16, "moe_experts vs the CUDA default");
      }
    }
  }
}

#ifdef KILN_HAVE_CUDA
// Route + experts captured as a graph and replayed with new logits and inputs at the same device
// addresses: the replays must follow the new routing, i.e. the kernels read the ids on the device.
TEST_F(CudaOps, MoeGraphReplayRoutesOnDevice) {
  Rng rng("CudaOps.MoeGraphReplay");
  auto& cb = static_cast<cuda::CudaBackend&>(*gpu_);
  cb.set_graphs_enabled(true);  // (unless KILN_CUDA_PROFILE is set: then begin_graph fails below)
  const int64_t n_experts = 16, k = 4, dim = 128, ffn = 64, n = 4;
  moe::Experts ex = moe::random_experts(rng, DType::bf16, n_experts, dim, ffn);
  const auto refs = ex.refs();
  ASSERT_TRUE(gpu_->moe_on_device(refs, n));
  std::vector<std::vector<int32_t>> seen_ids;
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    Tensor l = moe::logits(rng, n, n_experts, false), x = act(rng, {n, dim});
    Tensor ids = Tensor::host(DType::i32, {n, k}), w = Tensor::host(DType::f32, {n, k});
    cpu_->moe_route(l, int(k), true, ids, w);
    Tensor ref = Tensor::host(DType::f32, {n, dim});
    cpu_->moe_experts(x, refs, Activation::silu, ids, w, ref);
    StepScope scope(*gpu_);
    Tensor ld = dev(l), xd = dev(x);  // per-step buffers: the same addresses every step
    ASSERT_TRUE(gpu_->begin_graph(0x3e0e));
    Tensor idsd = gpu_->alloc(DType::i32, {n, k}), wd = gpu_->alloc(DType::f32, {n, k});
    Tensor out = gpu_->alloc(DType::bf16, {n, dim});
    gpu_->moe_route(ld, int(k), true, idsd, wd);
    gpu_->moe_experts(xd, refs, Activation::silu, idsd, wd, out);
    gpu_->end_graph();
    EXPECT_EQ(moe::int_values(gpu_->to_host(idsd)), moe::int_values(ids));
    expect_close(back(out), to_floats(ref), DType::bf16, "moe graph step");
    seen_ids.push_back(moe::int_values(ids));
  }
  EXPECT_GE(cb.stats().graph_captures, 1);
  EXPECT_GE(cb.stats().graph_replays, 3);
  EXPECT_NE(seen_ids[2], seen_ids[3]) << "random routings should differ between replayed steps";
}
#endif

}  // namespace
}  // namespace kiln::backend
