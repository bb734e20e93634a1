// A kernel timeline under CUDA graphs, for the device machine, which has no Nsight Systems: load it
// with LD_PRELOAD into any kiln executable and every kernel's GPU start/end (graph nodes included)
// goes to $KILN_KERNEL_TRACE (default kernel_trace.csv) as "start_ns,end_ns,blocks,threads,name".
// CUPTI delivers its activity buffers every 20 ms and at exit; bench/kernel_timeline.py reads the
// file. Tracing adds time between graph launches, not inside them (llama-3-8b 4-bit, batch 1: a
// step's kernels span ~2.2 ms traced as untraced, the launches between steps grow).
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

FILE* out = nullptr;

void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *size = size_t{1} << 18;
  *buf = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
    std::fprintf(out, "%llu,%llu,%lld,%d,%s\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), static_cast<long long>(k->gridX) * k->gridY * k->gridZ,
                 k->blockX * k->blockY * k->blockZ, k->name ? k->name : "?");
  }
  std::free(buf);
  std::fflush(out);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  std::fflush(out);
}

__attribute__((constructor)) void start_trace() {
  const char* path = std::getenv("KILN_KERNEL_TRACE");
  out = std::fopen(path ? path : "kernel_trace.csv", "w");
  if (!out) {
    std::fprintf(stderr, "[kernel_trace] cannot write %s\n", path ? path : "kernel_trace.csv");
    return;
  }
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "[kernel_trace] CUPTI refused kernel tracing\n");
    return;
  }
  cuptiActivityFlushPeriod(20);
  std::atexit(flush_at_exit);
}

}  // namespace
