// Quantized-weight ops on CUDA against the CPU reference backend (MLX affine layout,
// docs/quantization.md): matmul through the quantized GEMVs (one token; 4-bit up to 16, passes of 8)
// and through bf16 dequantized chunks + cuBLASLt (one and several chunks), and the quantized
// embedding gather, for every bit width (2, 3, 4, 5, 6, 8) and group size (32, 64, 128), scales in
// f32/bf16/f16. Fresh random packed words, scales, biases and activations each run (the seed is
// printed; KILN_TEST_SEED=<n> replays it); outputs are poisoned with NaN first.
// Tolerances on ‖gpu − cpu‖₂ / ‖cpu‖₂ and max |gpu − cpu| / max |cpu|:
//   bf16 outputs: 1e-2 and 2^-6 (bf16 rounding of the result; of the weights on the GEMM path);
//   f32 outputs of the GEMVs (one token, or up to 16 at 4 bits): 1e-4 and 1e-4 (exact weights, f32
//   sums in another order; the 4-bit kernel also rounds x to 15 bits of each group's range, an error
//   of at most 2^-16 of the group's max |x|); other f32 outputs: 1e-2 and 2^-6 (the dequantize +
//   cuBLASLt path rounds the dequantized weights to bf16).
// 4-bit weights are tiled on the device at first use (qkernels.h) and take the tensor-core GEMV for
// up to 16 tokens; the other widths keep the MLX layout and the CUDA-core GEMV.
// Reports SKIPPED where no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu_test_util.h"
#ifdef KILN_HAVE_CUDA
#include "kiln/backend/cuda/cuda_backend.h"
#endif

namespace kiln::backend {
namespace {

using cpu::test::Rng;
using cpu::test::to_floats;

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double tol_l2, double tol_max,
                  const std::string& what) {
  cpu::test::CloseStats st;
  ASSERT_NO_FATAL_FAILURE(cpu::test::close_stats(got, ref, what, &st));
  ASSERT_GT(st.sq_ref, 0) << what << ": the reference is all zeros";
  EXPECT_LE(std::sqrt(st.sq_err / st.sq_ref), tol_l2) << what << " rel-L2";
  EXPECT_LE(st.max_err / st.max_ref, tol_max) << what << " max error / max |ref|";
}

class CudaQOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    gpu_ = make_cuda_backend(0);
    cpu_ = make_cpu_backend();
  }
  // A random quantized [out, in] matrix: every packed word random (all codes occur), per-group
  // scales of ~1/(2^bits sqrt(in)) and biases that center the codes, so outputs are O(1).
  static Weight random_qweight(Rng& rng, int64_t out, int64_t in, int bits, int gs, DType sdt) {
    Weight w;
    w.bits = bits;
    w.group_size = gs;
    w.w = Tensor::host(DType::u32, {out, in * bits / 32});
    for (int64_t i = 0; i < w.w.numel(); ++i) w.w.ptr<uint32_t>()[i] = static_cast<uint32_t>(rng.gen()());
    const int64_t ng = in / gs;
    Tensor s = Tensor::host(DType::f32, {out, ng}), b = Tensor::host(DType::f32, {out, ng});
    const float s0 = 2.0f / (float((1 << bits) - 1) * std::sqrt(float(in)));
    for (int64_t i = 0; i < out * ng; ++i) {
      const float sc = s0 * rng.uniform(0.5f, 1.5f) * (rng.uniform(0, 1) < 0.2f ? -1.0f : 1.0f);
      s.ptr<float>()[i] = sc;
      b.ptr<float>()[i] = -sc * float((1 << bits) - 1) * rng.uniform(0.3f, 0.7f);
    }
    w.scales = convert(s, sdt);
    w.biases = convert(b, sdt);
    return w;
  }
  static Tensor convert(const Tensor& f, DType t) {
    if (t == DType::f32) return f;
    Tensor r = Tensor::host(t, f.shape);
    for (int64_t i = 0; i < f.numel(); ++i) {
      const float v = f.ptr<float>()[i];
      r.ptr<uint16_t>()[i] = t == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
    }
    return r;
  }
  // Activations: bf16 values (both backends see the same numbers), held as f32 for the CPU.
  Tensor act(Rng& rng, Shape s) {
    Tensor b = rng.tensor(DType::bf16, std::move(s));
    Tensor f = Tensor::host(DType::f32, b.shape);
    to_f32(b.data, b.dtype, f.ptr<float>(), b.numel());
    return f;
  }
  Tensor poisoned(DType t, Shape s) { return cpu::test::poisoned(*gpu_, t, std::move(s)); }
  static Tensor ints(const std::vector<int32_t>& v) { return cpu::test::host_ints(v); }

  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_F(CudaQOps, MatmulEveryWidthAndGroupSize) {
  Rng rng("CudaQOps.Matmul");
  struct Case {
    int64_t n, in, out;
  };
  // 1 token (every width's GEMV); 3, 8, 13 tokens (4-bit: the tensor-core GEMV, one or two 8-token
  // passes; other widths: dequantize + cuBLASLt); 32+ tokens: dequantize + cuBLASLt; odd row counts
  // (a partial last row tile / warp).
  const std::vector<Case> cases = {{1, 256, 96}, {3, 384, 131}, {8, 1024, 40}, {13, 512, 77}, {32, 128, 33},
                                   {33, 256, 50}, {70, 384, 129}, {1, 32, 7}, {1, 384, 131}};
  const DType sdts[] = {DType::bf16, DType::f16, DType::f32};
  int idx = 0;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int gs : {32, 64, 128})
      for (const Case& c : cases) {
        if (c.in % gs != 0) continue;
        const DType sdt = sdts[idx % 3], yt = idx % 2 ? DType::f32 : DType::bf16;
        const bool bias = idx % 4 == 1;
        ++idx;
        SCOPED_TRACE(fmt::format("bits={} gs={} n={} in={} out={} scales={} y={} bias={}", bits, gs, c.n, c.in, c.out,
                                 dtype_name(sdt), dtype_name(yt), bias));
        Weight w = random_qweight(rng, c.out, c.in, bits, gs, sdt);
        if (bias) w.bias = rng.tensor(DType::bf16, {c.out}, 0.5f);
        Tensor x = act(rng, {c.n, c.in});
        Tensor ref = Tensor::host(DType::f32, {c.n, c.out});
        cpu_->matmul(x, w, ref);
        Tensor y = poisoned(yt, {c.n, c.out});
        gpu_->matmul(gpu_->upload(convert(x, DType::bf16)), w, y);
        // f32 from a GEMV (exact weights); else bf16-rounded weights
        const bool exact_w = yt == DType::f32 && (c.n == 1 || (bits == 4 && c.n <= 16));
        expect_close(to_floats(gpu_->to_host(y)), to_floats(ref), exact_w ? 1e-4 : 1e-2, exact_w ? 1e-4 : 1.0 / 64,
                     "quantized matmul");
      }
}

TEST_F(CudaQOps, MatmulLargeShapes) {
  Rng rng("CudaQOps.MatmulLarge");
  struct Case {
    int64_t n, in, out;
    int bits, gs;
    bool bias;
  };
  // 8B-model projections at batch 1 and 8; every rows-per-warp variant (4 rows from 4096 rows at
  // one token, 2 from 2048, with a partial last warp); f32 activations (converted on the device);
  // a prefill product whose dequantized weight spans two chunks.
  const std::vector<Case> cases = {{1, 4096, 8195, 4, 64, false},  {8, 4096, 1024, 4, 64, true},
                                   {5, 14336, 512, 4, 128, false}, {1, 2048, 9000, 3, 32, true},
                                   {1, 512, 3001, 5, 32, false},   {3, 640, 2049, 6, 64, true},
                                   {6, 1024, 4100, 8, 128, true},  {1, 4096, 4097, 2, 64, false},
                                   {40, 4096, 16500, 4, 64, true},
                                   // 4-bit tensor-core GEMV: several rounds of quads per warp with a partial
                                   // last one; 130 units (a partial last quad, uneven K split).
                                   {1, 14336, 1000, 4, 64, true},  {1, 4160, 33, 4, 32, false},
                                   {16, 4160, 300, 4, 32, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("n={} in={} out={} bits={} gs={}", c.n, c.in, c.out, c.bits, c.gs));
    Weight w = random_qweight(rng, c.out, c.in, c.bits, c.gs, DType::bf16);
    if (c.bias) w.bias = rng.tensor(DType::bf16, {c.out}, 0.5f);
    Tensor x = act(rng, {c.n, c.in});
    Tensor ref = Tensor::host(DType::f32, {c.n, c.out});
    cpu_->matmul(x, w, ref);
    Tensor y = poisoned(DType::bf16, {c.n, c.out});
    gpu_->matmul(gpu_->upload(x), w, y);  // x in f32: the backend converts it to bf16
    expect_close(to_floats(gpu_->to_host(y)), to_floats(ref), 1e-2, 1.0 / 64, "quantized matmul");
  }
}

// matmul_multi over 4-bit weights (q/k/v-, gate/up-like: one launch of the tensor-core GEMV for all
// matrices): each output against the CPU, and bit-equal to that weight's own matmul on CUDA.
TEST_F(CudaQOps, MatmulMultiFourBit) {
  Rng rng("CudaQOps.MatmulMulti");
  for (int64_t n : {1, 5, 16})
    for (int gs : {32, 64, 128}) {
      SCOPED_TRACE(fmt::format("n={} gs={}", n, gs));
      const int64_t in = 640;
      const int64_t outs[3] = {520, 136, 9};
      Weight w[3];
      for (int i = 0; i < 3; ++i) {
        w[i] = random_qweight(rng, outs[i], in, 4, gs, gs == 128 ? DType::f16 : DType::bf16);
        if (i != 1) w[i].bias = rng.tensor(DType::bf16, {outs[i]}, 0.5f);
      }
      Tensor x = act(rng, {n, in});
      Tensor xd = gpu_->upload(convert(x, DType::bf16));
      Tensor y[3] = {poisoned(DType::bf16, {n, outs[0]}), poisoned(DType::bf16, {n, outs[1]}),
                     poisoned(DType::f32, {n, outs[2]})};
      const Weight* ws[3] = {&w[0], &w[1], &w[2]};
      Tensor* ys[3] = {&y[0], &y[1], &y[2]};
      gpu_->matmul_multi(xd, ws, ys);
      std::vector<float> first[3];
      for (int i = 0; i < 3; ++i) first[i] = to_floats(gpu_->to_host(y[i]));
      gpu_->matmul_multi(xd, ws, ys);  // the same bits again (the GEMV's cross-warp sums have a fixed order)
      for (int i = 0; i < 3; ++i) {
        Tensor ref = Tensor::host(DType::f32, {n, outs[i]});
        cpu_->matmul(x, w[i], ref);
        const std::vector<float> got = to_floats(gpu_->to_host(y[i]));
        EXPECT_EQ(got, first[i]) << "matrix " << i << ": a second identical call differs";
        expect_close(got, to_floats(ref), 1e-2, 1.0 / 64, fmt::format("matrix {}", i));
        Tensor solo = poisoned(y[i].dtype, y[i].shape);
        gpu_->matmul(xd, w[i], solo);
        expect_close(to_floats(gpu_->to_host(solo)), to_floats(ref), 1e-2, 1.0 / 64, fmt::format("matrix {} alone", i));
      }
    }
}

// The 4-bit GEMV rounds x per (token, group) to integers on a scale of the group's max |x|: groups of
// zeros, a 1000x outlier beside ordinary values, and tiny values (1e-30) must come out as the CPU's.
// Tolerance 1e-3: where the outlier's term dominates every output, its group's other values keep
// ~15 bits of the outlier's range: ~1e-4 relative error in y (measured on the H200: 3.2e-4 for the
// largest); a broken zero / tiny / clamp case gives NaN or errors of order 1.
TEST_F(CudaQOps, FourBitGemvActivationRanges) {
  Rng rng("CudaQOps.ActivationRanges");
  const int64_t in = 512, out = 200;
  for (int gs : {32, 64, 128})
    for (int64_t n : {1, 3}) {
      SCOPED_TRACE(fmt::format("gs={} n={}", gs, n));
      Weight w = random_qweight(rng, out, in, 4, gs, DType::bf16);
      Tensor x = act(rng, {n, in});
      float* xp = x.ptr<float>();
      for (int64_t r = 0; r < n; ++r) {
        float* row = xp + r * in;
        for (int64_t c = 0; c < gs; ++c) row[c] = 0.0f;              // group 0: zeros
        row[gs + 3] = 1000.0f;                                        // group 1: one outlier
        for (int64_t c = 2 * gs; c < 3 * gs; ++c) row[c] *= 1e-30f;  // group 2: tiny
        for (int64_t c = 0; c < in; ++c) row[c] = bf16_to_f32(f32_to_bf16(row[c]));
      }
      Tensor ref = Tensor::host(DType::f32, {n, out});
      cpu_->matmul(x, w, ref);
      Tensor y = poisoned(DType::f32, {n, out});
      gpu_->matmul(gpu_->upload(convert(x, DType::bf16)), w, y);
      expect_close(to_floats(gpu_->to_host(y)), to_floats(ref), 1e-3, 1e-3, "4-bit GEMV");
    }
}

// Inside a step, the producer ops (rms_norm, add_rms_norm, gated_act) also write the 4-bit GEMV's
// quantized activations beside their bf16 output (the backend's activation cache), and the GEMV then
// skips its own quantize kernel: the same bits as from a plain copy of the output (nothing cached).
// An op that writes the output again ends its cached copy; outside a step there is none. Rows of 4.5
// and 3.5 quads (partial last quads), 1 and 3 tokens.
TEST_F(CudaQOps, ProducedActivationsFeedTheFourBitGemv) {
#ifdef KILN_HAVE_CUDA
  Rng rng("CudaQOps.Produced");
  auto* cb = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  ASSERT_NE(cb, nullptr);
  auto cached = [&](const Tensor& t) { return cb->has_cached_qx(t); };
  const int64_t dim = 576, ffn = 448, out = 200;
  const Tensor nw = rng.tensor(DType::bf16, {dim}, 1.0f);
  auto dev = [&](Shape s) { return gpu_->upload(convert(act(rng, std::move(s)), DType::bf16)); };
  for (int64_t n : {1, 3}) {
    SCOPED_TRACE(fmt::format("n={}", n));
    const Weight wq = random_qweight(rng, out, dim, 4, 64, DType::bf16);
    const Weight wd = random_qweight(rng, out, ffn, 4, 64, DType::bf16);
    gpu_->begin_step();
    {
      Tensor x = dev({n, dim}), d = dev({n, dim}), g = dev({n, ffn}), u = dev({n, ffn});
      Tensor first = gpu_->alloc(DType::f32, {n, out});
      gpu_->matmul(x, wq, first);  // first uses tile the weights (and name the group size to quantize for)
      gpu_->matmul(g, wd, first);
      auto same_as_plain = [&](const Tensor& produced, const Weight& w, const char* what) {
        Tensor plain = gpu_->alloc(DType::bf16, produced.shape);
        gpu_->copy(produced, plain);
        Tensor y1 = gpu_->alloc(DType::f32, {n, out}), y2 = gpu_->alloc(DType::f32, {n, out});
        gpu_->matmul(produced, w, y1);
        gpu_->matmul(plain, w, y2);
        EXPECT_FALSE(cached(plain)) << what;
        EXPECT_EQ(to_floats(gpu_->to_host(y1)), to_floats(gpu_->to_host(y2))) << what;
      };
      Tensor h = gpu_->alloc(DType::bf16, {n, dim});
      gpu_->rms_norm(x, nw, 1e-5f, false, h);
      EXPECT_TRUE(cached(h)) << "rms_norm";
      same_as_plain(h, wq, "rms_norm");
      gpu_->add_rms_norm(x, d, nw, 1e-5f, false, h);
      EXPECT_TRUE(cached(h)) << "add_rms_norm";
      EXPECT_FALSE(cached(x)) << "add_rms_norm's residual";
      same_as_plain(h, wq, "add_rms_norm");
      gpu_->gated_act(g, u, Activation::silu, g);
      EXPECT_TRUE(cached(g)) << "gated_act";
      same_as_plain(g, wd, "gated_act");
      gpu_->scale(h, 2.0f);
      EXPECT_FALSE(cached(h)) << "scale wrote h";
      same_as_plain(h, wq, "h after scale");
      // Decode attention (8 heads of 128 over 2 kv heads, blocks of 16 rows): contexts of 40 keys (one
      // split writes the output) and of 700 / 300 (splits merged by the last block to finish).
      AttnParams p;
      p.n_heads = 8, p.n_kv_heads = 2, p.head_dim = 128, p.scale = 0.088f, p.block_size = 16, p.max_blocks = 44;
      const int32_t lens[] = {40, 700, 300};
      Tensor tables = Tensor::host(DType::i32, {n, p.max_blocks}), seqs = Tensor::host(DType::i32, {n}),
             pos = Tensor::host(DType::i32, {n});
      for (int64_t i = 0; i < n; ++i) {
        seqs.ptr<int32_t>()[i] = static_cast<int32_t>(i);
        pos.ptr<int32_t>()[i] = lens[i] - 1;
        for (int b = 0; b < p.max_blocks; ++b)
          tables.ptr<int32_t>()[i * p.max_blocks + b] = static_cast<int32_t>(i * p.max_blocks + b);
      }
      const Weight wo = random_qweight(rng, out, 1024, 4, 64, DType::bf16);
      Tensor q = dev({n, 1024}), kc = dev({n * p.max_blocks * 16, 256}), vc = dev({n * p.max_blocks * 16, 256});
      Tensor attn = gpu_->alloc(DType::bf16, {n, 1024});
      gpu_->attention(q, kc, vc, gpu_->upload(tables), gpu_->upload(seqs), gpu_->upload(pos), p, attn);
      EXPECT_TRUE(cached(attn)) << "attention";
      same_as_plain(attn, wo, "attention");
    }
    gpu_->end_step();
  }
  Tensor x = dev({1, dim}), h = gpu_->alloc(DType::bf16, {1, dim});
  gpu_->rms_norm(x, nw, 1e-5f, false, h);
  EXPECT_FALSE(cached(h)) << "outside a step";
#else
  GTEST_SKIP() << "a build without CUDA";
#endif
}

// 4-bit experts stacked in one tensor each for codes, scales and biases (mlx-lm's switch_mlp
// [E, out, in]) and used through per-expert row views, as the MoE models do: every view is tiled at
// its first use, and the stacked MLX copies leave the device once all experts are tiled, not before
// (weight bytes on the device: the uploads, plus each tiled expert, minus the stacked copies).
TEST_F(CudaQOps, StackedFourBitExpertsDropTheirMlxCopiesOnceAllAreTiled) {
#ifdef KILN_HAVE_CUDA
  Rng rng("CudaQOps.Stacked");
  constexpr int64_t E = 4, out = 40, in = 320;  // 3 tiles x 3 quads per expert: rows and codes padded
  constexpr int gs = 64;
  Tensor w = Tensor::host(DType::u32, {E, out, in / 8});
  Tensor sc = Tensor::host(DType::bf16, {E, out, in / gs}), bi = Tensor::host(DType::bf16, {E, out, in / gs});
  std::vector<Weight> experts(E);
  for (int64_t e = 0; e < E; ++e) {
    const Weight one = random_qweight(rng, out, in, 4, gs, DType::bf16);
    std::memcpy(w.ptr<uint32_t>() + e * out * (in / 8), one.w.data, one.w.nbytes());
    std::memcpy(sc.ptr<uint16_t>() + e * out * (in / gs), one.scales.data, one.scales.nbytes());
    std::memcpy(bi.ptr<uint16_t>() + e * out * (in / gs), one.biases.data, one.biases.nbytes());
  }
  auto rows = [&](const Tensor& t, int64_t e) { return t.view({E * out, t.dim(2)}).slice_rows(e * out, (e + 1) * out); };
  for (int64_t e = 0; e < E; ++e) {
    experts[e].bits = 4;
    experts[e].group_size = gs;
    experts[e].w = rows(w, e);
    experts[e].scales = rows(sc, e);
    experts[e].biases = rows(bi, e);
  }
  auto* cb = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  ASSERT_NE(cb, nullptr);
  const int64_t before = cb->stats().weight_bytes;
  for (const Tensor* t : {&w, &sc, &bi}) gpu_->prefetch_weight(*t);
  const int64_t stacked = static_cast<int64_t>(w.nbytes() + sc.nbytes() + bi.nbytes());
  ASSERT_EQ(cb->stats().weight_bytes, before + stacked);
  // One expert tiled (docs/quantization.md): 1 KB of codes per (tile, quad), and per (tile, quad)
  // 16 rows x (128 / gs) (scale, bias) pairs of bf16.
  const int64_t tq = ((out + 15) / 16) * ((in + 127) / 128), tiled = tq * 1024 + tq * 16 * (128 / gs) * 2 * 2;
  const Tensor x = act(rng, {1, in}), xd = gpu_->upload(convert(x, DType::bf16));
  for (int pass = 0; pass < 2; ++pass)  // the second pass runs on the tiled copies alone
    for (int64_t e = 0; e < E; ++e) {
      SCOPED_TRACE(fmt::format("pass {} expert {}", pass, e));
      Tensor y = poisoned(DType::f32, {1, out}), ref = Tensor::host(DType::f32, {1, out});
      gpu_->matmul(xd, experts[e], y);
      cpu_->matmul(x, experts[e], ref);
      expect_close(to_floats(gpu_->to_host(y)), to_floats(ref), 1e-4, 1e-4, "expert");
      const int64_t want = pass == 0 && e + 1 < E ? before + stacked + (e + 1) * tiled : before + E * tiled;
      EXPECT_EQ(cb->stats().weight_bytes, want) << "device weight bytes";
    }
#else
  GTEST_SKIP() << "a build without CUDA";
#endif
}

TEST_F(CudaQOps, EmbeddingEveryWidth) {
  Rng rng("CudaQOps.Embedding");
  int idx = 0;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int gs : {32, 64, 128})
      for (DType ot : {DType::bf16, DType::f32}) {
        const int64_t vocab = 1000 + idx, dim = 384;
        const DType sdt = idx++ % 2 ? DType::f16 : DType::bf16;
        SCOPED_TRACE(fmt::format("bits={} gs={} out={} scales={}", bits, gs, dtype_name(ot), dtype_name(sdt)));
        Weight table = random_qweight(rng, vocab, dim, bits, gs, sdt);
        std::vector<int32_t> id(29);
        for (auto& v : id) v = static_cast<int32_t>(rng.uniform_int(0, vocab - 1));
        id[3] = 0, id[4] = static_cast<int32_t>(vocab - 1);
        Tensor ref = Tensor::host(DType::f32, {29, dim});
        cpu_->embedding(table, ints(id), ref);
        Tensor out = poisoned(ot, {29, dim});
        gpu_->embedding(table, gpu_->upload(ints(id)), out);
        // bf16: one rounding of scale * q + bias; f32: the same f32 expression (FMA or not).
        expect_close(to_floats(gpu_->to_host(out)), to_floats(ref), ot == DType::f32 ? 1e-6 : 4e-3,
                     ot == DType::f32 ? 1e-6 : 1.0 / 128, "quantized embedding");
      }
}

TEST_F(CudaQOps, MalformedWeightFailsByName) {
  Rng rng("CudaQOps.Malformed");
  Weight w = random_qweight(rng, 64, 256, 4, 64, DType::bf16);
  w.scales = Tensor::host(DType::bf16, {64, 3});  // 4 groups per row expected
  Tensor y = poisoned(DType::bf16, {1, 64});
  try {
    gpu_->matmul(gpu_->upload(convert(act(rng, {1, 256}), DType::bf16)), w, y);
    FAIL() << "a quantized weight with mis-shaped scales was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scales"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::backend
