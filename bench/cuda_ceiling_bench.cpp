// cuda_ceiling_bench: the GPU's two ceilings measured through kiln's own CUDA backend, for the
// bounds in BENCHMARKS.md: device-to-device copy bandwidth (bytes read + written, 4 GiB buffers)
// and the bf16 GEMM rate (8192 x 8192 x 8192 through cuBLASLt, random data). Median of 10 timed
// batches after warm-up. Prints one JSON line. Exits 1 when there is no CUDA device.
#include <cstdio>

#include "bench_util.h"
#include "kiln/backend/backend.h"

using namespace kiln;
using bench::median_seconds;
using bench::random_bf16;

int main() {
  if (!backend::cuda_device_available()) {
    std::fprintf(stderr, "cuda_ceiling_bench: no CUDA device\n");
    return 1;
  }
  try {
    auto be = backend::make_cuda_backend(0);
    // Copy: 4 GiB source filled with random 64 MiB tiles, into a second buffer.
    const int64_t tile = 32 << 20, n = int64_t{2} << 30;  // bf16 elements: 64 MiB tiles, 4 GiB total
    Tensor src = be->alloc(DType::bf16, {n}), dst = be->alloc(DType::bf16, {n});
    Tensor r = be->upload(random_bf16({tile}, 7));
    for (int64_t off = 0; off < n; off += tile) {
      Tensor part = src.slice_rows(off, off + tile);
      be->copy(r, part);
    }
    double t_copy = median_seconds(*be, [&] { be->copy(src, dst); }, 5);
    const double copy_gbs = 2.0 * static_cast<double>(src.nbytes()) / t_copy / 1e9;
    src = {}, dst = {}, r = {};

    const int64_t N = 8192;
    backend::Weight w;
    w.w = random_bf16({N, N}, 11);
    be->prefetch_weight(w.w);
    Tensor x = be->upload(random_bf16({N, N}, 13)), y = be->alloc(DType::bf16, {N, N});
    double t_gemm = median_seconds(*be, [&] { be->matmul(x, w, y); }, 5);
    const double tflops = 2.0 * N * N * N / t_gemm / 1e12;
    std::printf("{\"copy_GBps\": %.1f, \"gemm_TFLOPs\": %.1f, \"copy_ms\": %.3f, \"gemm_ms\": %.3f}\n", copy_gbs, tflops,
                t_copy * 1e3, t_gemm * 1e3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_ceiling_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
