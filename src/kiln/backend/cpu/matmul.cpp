// matmul on the CPU: y [n, out] = x [n, in] · wᵀ (+ bias), w [out, in] f32/bf16/f16 read in place,
// or packed affine-quantized (MLX layout) read in place by the quantized kernels.
// Decode (n < kGemmMinTokens): a GEMV that streams each weight row once for all n tokens, output
// rows split over the pool. Prefill: a blocked GEMM; each thread owns tiles of kTileRows output
// rows, packs a [kTileRows x kKc] weight block to f32 panels and runs the register microkernel over
// all tokens, so each weight element is converted once per call and reused n times from L2.
#include <algorithm>
#include <vector>

#include "kiln/backend/checks.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln::backend::cpu {

namespace {

constexpr int64_t kKc = 256;        // k-block: a packed panel row-block of kKc x nr floats stays in L1/L2
constexpr int64_t kTileRows = 128;  // output rows per tile (a multiple of every level's gemm_nr)
constexpr int64_t kMc = 240;        // tokens per x block (a multiple of 8 and 12: m tiles stay whole)
constexpr int64_t kGemvMinWork = 1 << 16;  // weight elements per GEMV chunk before splitting


// pack(r0, n_rows, k0, kc, dst, scratch) fills dst with the f32 panels of that weight block
// (Kernels::gemm_pack's layout); scratch is a per-thread buffer of kTileRows * kKc floats.
template <class Pack>
void gemm(const Kernels& k, ThreadPool& pool, const float* x, int64_t n, int64_t in, int64_t out, float* y,
          const Pack& pack) {
  const int64_t nr = k.gemm_nr, mr = k.gemm_mr;
  const int64_t n_tiles = (out + kTileRows - 1) / kTileRows;
  // Token tiles of near-equal size <= mr (16 tokens with mr = 12 run as 8 + 8, not 12 + 4).
  const int64_t m_tiles = (n + mr - 1) / mr, m_step = (n + m_tiles - 1) / m_tiles;
  pool.parallel_for(n_tiles, [&](int64_t tb, int64_t te) {
    // packed [ceil(kTileRows / nr) panels][kKc][nr] f32, one per thread.
    std::vector<float> packed(((kTileRows + nr - 1) / nr) * nr * kKc);
    std::vector<float> scratch;
    for (int64_t tile = tb; tile < te; ++tile) {
      const int64_t r0 = tile * kTileRows, n_rows = std::min(kTileRows, out - r0);
      const int64_t n_panels = (n_rows + nr - 1) / nr;
      for (int64_t k0 = 0; k0 < in; k0 += kKc) {
        const int64_t kc = std::min(kKc, in - k0);
        pack(r0, n_rows, k0, kc, packed.data(), scratch);
        // Token blocks of kMc (their x block, kMc x kc floats, stays in L2), then panel outer and
        // tokens inner: the panel (kc x nr floats, <= 32 KiB) stays in L1 while x rows stream.
        for (int64_t mb = 0; mb < n; mb += kMc) {
          const int64_t me = std::min(n, mb + kMc);
          for (int64_t p = 0; p < n_panels; ++p) {
            const int64_t nc = std::min(nr, n_rows - p * nr);
            for (int64_t m0 = mb; m0 < me; m0 += m_step) {
              const int64_t mc = std::min(m_step, me - m0);
              k.gemm_micro(x + m0 * in + k0, in, mc, packed.data() + p * kc * nr, kc, y + m0 * out + r0 + p * nr,
                           out, nc, k0 > 0);
            }
          }
        }
      }
    }
  }, n * in * out < (int64_t{1} << 18) ? n_tiles : 1);  // tiny products stay on the caller
}

// Quantized weights: the decode GEMV reads each packed row once (Kernels::qgemv, with the per-group
// sums of x computed here once per call); the prefill GEMM dequantizes each [kTileRows x kKc] block
// to f32 (Kernels::qdequant; kKc is a multiple of every group size) and packs it like a dense one.
void matmul_quantized(const Kernels& k, ThreadPool& pool, const float* xp, int64_t n, const QMatrix& q, float* yp) {
  const int64_t in = q.in, out = q.out, gs = q.group_size, n_groups = q.n_groups();
  if (n < kGemmMinTokens) {
    std::vector<float> xsum(n * n_groups);  // [n, n_groups]
    for (int64_t t = 0; t < n; ++t)
      for (int64_t g = 0; g < n_groups; ++g) {
        float s = 0.0f;
        for (int64_t j = 0; j < gs; ++j) s += xp[t * in + g * gs + j];
        xsum[t * n_groups + g] = s;
      }
    const int64_t min_rows = std::max<int64_t>(1, kGemvMinWork / std::max<int64_t>(1, in));
    pool.parallel_for(out, [&](int64_t r0, int64_t r1) { k.qgemv(xp, n, in, xsum.data(), q, r0, r1, yp, out); },
                      min_rows);
    return;
  }
  gemm(k, pool, xp, n, in, out, yp,
       [&](int64_t r0, int64_t n_rows, int64_t k0, int64_t kc, float* dst, std::vector<float>& scratch) {
         scratch.resize(kTileRows * kKc);
         for (int64_t r = 0; r < n_rows; ++r) k.qdequant(q, r0 + r, k0, kc, scratch.data() + r * kc);
         k.gemm_pack(scratch.data(), DType::f32, kc, 0, n_rows, 0, kc, dst);
       });
}

}  // namespace

QMatrix qmatrix_of(const Weight& w) {
  checks::quantized_weight("cpu", nullptr, w);
  const int64_t out = w.w.dim(0), row_bytes = w.w.dim(1) * 4;
  const auto* codes = static_cast<const uint8_t*>(w.w.data);
  return {.w = codes, .end = codes + out * row_bytes, .row_bytes = row_bytes, .scales = w.scales.data,
          .biases = w.biases.data, .sdt = w.scales.dtype, .bits = w.bits, .group_size = w.group_size,
          .in = w.in_features(), .out = out};
}

void matmul(const Kernels& k, ThreadPool& pool, const Tensor& x, const Weight& w, Tensor& y) {
  const Tensor& wt = w.w;
  if (!w.quantized()) checks::float_matrix("cpu", "matmul", "weight", wt);
  if (x.dtype != DType::f32 || y.dtype != DType::f32)
    fail("cpu", "matmul: x and y must be float32, got {} and {}", dtype_name(x.dtype), dtype_name(y.dtype));
  QMatrix q;
  if (w.quantized()) q = qmatrix_of(w);
  const int64_t out = wt.dim(0), in = w.quantized() ? q.in : wt.dim(1);
  checks::matmul("cpu", x, wt.shape, in, out, w.bias, y);
  const int64_t n = x.rows();
  if (n == 0) return;

  const float* xp = x.ptr<float>();
  float* yp = y.ptr<float>();
  if (w.quantized()) {
    matmul_quantized(k, pool, xp, n, q, yp);
  } else if (n < kGemmMinTokens || in == 0) {
    const int64_t min_rows = std::max<int64_t>(1, kGemvMinWork / std::max<int64_t>(1, in));
    pool.parallel_for(out, [&](int64_t r0, int64_t r1) {
      k.gemv(xp, n, in, wt.data, wt.dtype, in, r0, r1, yp, out);
    }, min_rows);
  } else {
    gemm(k, pool, xp, n, in, out, yp,
         [&](int64_t r0, int64_t n_rows, int64_t k0, int64_t kc, float* dst, std::vector<float>&) {
           k.gemm_pack(wt.data, wt.dtype, in, r0, n_rows, k0, kc, dst);
         });
  }

  if (!w.bias.empty()) {
    std::vector<float> b(out);
    k.to_f32(w.bias.data, w.bias.dtype, b.data(), out);
    for (int64_t t = 0; t < n; ++t) k.axpy(1.0f, b.data(), yp + t * out, out);
  }
}

}  // namespace kiln::backend::cpu
