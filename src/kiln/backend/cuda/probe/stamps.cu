// Host side of a probe build's per-block timestamps (stamps.cuh): the records' allocation, every
// translation unit's pointer to them, and their file at exit. Built only with -DKILN_CUDA_STAMPS=ON.
#include "kiln/backend/cuda/core/common.cuh"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace kiln::backend::cuda {

namespace {

constexpr unsigned kStampSms = 256, kStampsPerSm = 1u << 15;  // 256 x 32768 x 48 B = 403 MB

std::vector<void (*)(const StampBuf&)>& stamp_setters() {
  static std::vector<void (*)(const StampBuf&)> v;
  return v;
}

StampBuf g_host{};
const char* g_path = nullptr;

// Writes each SM's records (those that fit) to the file, in SM order; the analysis sorts them.
void stamps_write() {
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::fprintf(stderr, "[stamps] device error at exit: no records written\n");
    return;
  }
  std::vector<unsigned> count(kStampSms);
  cudaMemcpy(count.data(), g_host.count, kStampSms * sizeof(unsigned), cudaMemcpyDeviceToHost);
  std::FILE* f = std::fopen(g_path, "wb");
  if (!f) {
    std::fprintf(stderr, "[stamps] cannot write %s\n", g_path);
    return;
  }
  std::vector<StampRec> rec(kStampsPerSm);
  size_t kept = 0, dropped = 0;
  for (unsigned sm = 0; sm < kStampSms; ++sm) {
    const unsigned n = count[sm] < kStampsPerSm ? count[sm] : kStampsPerSm;
    dropped += count[sm] - n;
    if (n == 0) continue;
    cudaMemcpy(rec.data(), g_host.rec + size_t{sm} * kStampsPerSm, n * sizeof(StampRec), cudaMemcpyDeviceToHost);
    std::fwrite(rec.data(), sizeof(StampRec), n, f);
    kept += n;
  }
  std::fclose(f);
  std::fprintf(stderr, "[stamps] %zu block records to %s (%zu dropped: an SM's buffer was full)\n", kept, g_path,
               dropped);
}

}  // namespace

bool stamps_register(void (*set)(const StampBuf&)) {
  stamp_setters().push_back(set);
  return true;
}

void stamps_start() {
  static const bool once = [] {
    static const std::string path = CudaOptions::from_env().stamps_file;
    if (path.empty()) return false;
    g_path = path.c_str();
    if (cudaMalloc(&g_host.rec, size_t{kStampSms} * kStampsPerSm * sizeof(StampRec)) != cudaSuccess ||
        cudaMalloc(&g_host.count, kStampSms * sizeof(unsigned)) != cudaSuccess) {
      std::fprintf(stderr, "[stamps] no device memory for the records: stamps off\n");
      return false;
    }
    cudaMemset(g_host.count, 0, kStampSms * sizeof(unsigned));
    g_host.per_sm = kStampsPerSm;
    for (auto set : stamp_setters()) set(g_host);
    std::atexit(stamps_write);  // after the runtime's own handler was registered: runs before it
    return true;
  }();
  (void)once;
}

}  // namespace kiln::backend::cuda
