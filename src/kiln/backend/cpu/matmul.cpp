// matmul on the CPU: y [n, out] = x [n, in] · wᵀ (+ bias), w [out, in] f32/bf16/f16 read in place.
// Decode (n < kGemmMinTokens): a GEMV that streams each weight row once for all n tokens, output
// rows split over the pool. Prefill: a blocked GEMM; each thread owns tiles of kTileRows output
// rows, packs a [kTileRows x kKc] weight block to f32 panels and runs the register microkernel over
// all tokens, so each weight element is converted once per call and reused n times from L2.
#include <algorithm>
#include <vector>

#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln::backend::cpu {

namespace {

constexpr int64_t kKc = 256;        // k-block: a packed panel row-block of kKc x nr floats stays in L1/L2
constexpr int64_t kTileRows = 128;  // output rows per tile (a multiple of every level's gemm_nr)
constexpr int64_t kMc = 240;        // tokens per x block (a multiple of 8 and 12: m tiles stay whole)
constexpr int64_t kGemvMinWork = 1 << 16;  // weight elements per GEMV chunk before splitting

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

void gemm(const Kernels& k, ThreadPool& pool, const float* x, int64_t n, int64_t in, const void* w, DType wt,
          int64_t out, float* y) {
  const int64_t nr = k.gemm_nr, mr = k.gemm_mr;
  const int64_t n_tiles = (out + kTileRows - 1) / kTileRows;
  // Token tiles of near-equal size <= mr (16 tokens with mr = 12 run as 8 + 8, not 12 + 4).
  const int64_t m_tiles = (n + mr - 1) / mr, m_step = (n + m_tiles - 1) / m_tiles;
  pool.parallel_for(n_tiles, [&](int64_t tb, int64_t te) {
    // packed [ceil(kTileRows / nr) panels][kKc][nr] f32, one per thread.
    std::vector<float> packed(((kTileRows + nr - 1) / nr) * nr * kKc);
    for (int64_t tile = tb; tile < te; ++tile) {
      const int64_t r0 = tile * kTileRows, n_rows = std::min(kTileRows, out - r0);
      const int64_t n_panels = (n_rows + nr - 1) / nr;
      for (int64_t k0 = 0; k0 < in; k0 += kKc) {
        const int64_t kc = std::min(kKc, in - k0);
        k.gemm_pack(w, wt, in, r0, n_rows, k0, kc, packed.data());
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

}  // namespace

void matmul(const Kernels& k, ThreadPool& pool, const Tensor& x, const Weight& w, Tensor& y) {
  if (w.quantized()) fail("cpu", "quantized matmul not implemented yet");
  const Tensor& wt = w.w;
  if (!is_float(wt.dtype) || wt.ndim() != 2)
    fail("cpu", "matmul: weight must be a 2-D float tensor, got {} {}", dtype_name(wt.dtype), shape_str(wt.shape));
  if (x.dtype != DType::f32 || y.dtype != DType::f32)
    fail("cpu", "matmul: x and y must be float32, got {} and {}", dtype_name(x.dtype), dtype_name(y.dtype));
  const int64_t out = wt.dim(0), in = wt.dim(1);
  if (x.cols() != in) fail("cpu", "matmul: x {} does not match weight {}", shape_str(x.shape), shape_str(wt.shape));
  const int64_t n = x.rows();
  if (y.numel() != n * out)
    fail("cpu", "matmul: y {} for x {} and weight {}", shape_str(y.shape), shape_str(x.shape), shape_str(wt.shape));
  if (n == 0) return;
  if (x.data == y.data) fail("cpu", "matmul: y must not alias x");

  const float* xp = x.ptr<float>();
  float* yp = y.ptr<float>();
  if (n < kGemmMinTokens || in == 0) {
    const int64_t min_rows = std::max<int64_t>(1, kGemvMinWork / std::max<int64_t>(1, in));
    pool.parallel_for(out, [&](int64_t r0, int64_t r1) {
      k.gemv(xp, n, in, wt.data, wt.dtype, in, r0, r1, yp, out);
    }, min_rows);
  } else {
    gemm(k, pool, xp, n, in, wt.data, wt.dtype, out, yp);
  }

  if (!w.bias.empty()) {
    if (!is_float(w.bias.dtype) || w.bias.numel() != out)
      fail("cpu", "matmul: bias {} {} for {} outputs", dtype_name(w.bias.dtype), shape_str(w.bias.shape), out);
    std::vector<float> b(out);
    k.to_f32(w.bias.data, w.bias.dtype, b.data(), out);
    for (int64_t t = 0; t < n; ++t) k.axpy(1.0f, b.data(), yp + t * out, out);
  }
}

}  // namespace kiln::backend::cpu
