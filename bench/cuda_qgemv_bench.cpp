// cuda_qgemv_bench: the quantized GEMV alone, through the CUDA backend's matmul, on the projection
// shapes of llama-3-8b: achieved bandwidth for the packed bytes (weights + scales + biases) against
// the measured device copy bandwidth, per shape and bit width, and the sum of one decode step's
// projections. Each shape cycles over enough weight copies (>= 384 MB) that L2 (50 MB) cannot serve
// them; random packed words and scales. Usage: cuda_qgemv_bench [--reps N] [--bits B (16 = bf16)] [--batch N]
// [--shape NAME (one of the shapes below, e.g. gate/up_proj)]. Prints JSON lines, then a table.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

uint64_t g_state = 0x9E3779B97F4A7C15ull;
uint32_t next_u32() {
  g_state ^= g_state << 13, g_state ^= g_state >> 7, g_state ^= g_state << 17;
  return static_cast<uint32_t>(g_state >> 16);
}

backend::Weight make_weight(backend::Backend& be, int64_t out, int64_t in, int bits, int gs) {
  backend::Weight w;
  if (bits == 16) {  // dense bf16 for comparison
    Tensor h = Tensor::host(DType::bf16, {out, in});
    for (int64_t i = 0; i < h.numel(); ++i) h.ptr<uint16_t>()[i] = f32_to_bf16((static_cast<int>(next_u32() % 2001) - 1000) * 1e-5f);
    w.w = be.upload(h);
    return w;
  }
  w.bits = bits;
  w.group_size = gs;
  Tensor h = Tensor::host(DType::u32, {out, in * bits / 32});
  for (int64_t i = 0; i < h.numel(); ++i) h.ptr<uint32_t>()[i] = next_u32();
  Tensor s = Tensor::host(DType::bf16, {out, in / gs}), b = Tensor::host(DType::bf16, {out, in / gs});
  for (int64_t i = 0; i < s.numel(); ++i) {
    s.ptr<uint16_t>()[i] = f32_to_bf16(1e-3f * (1 + next_u32() % 100) / 100);
    b.ptr<uint16_t>()[i] = f32_to_bf16(-1e-3f * (next_u32() % 100) / 10);
  }
  w.w = be.upload(h);
  w.scales = be.upload(s);
  w.biases = be.upload(b);
  return w;
}

double weight_bytes(const backend::Weight& w) {
  return static_cast<double>(w.w.nbytes() + w.scales.nbytes() + w.biases.nbytes());
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30, only_bits = 0, only_batch = 0;  // 0: every run
  std::string only_shape;                         // empty: every shape
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--bits") == 0) only_bits = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--batch") == 0) only_batch = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--shape") == 0) only_shape = argv[i + 1];
  }
  try {
    if (!backend::cuda_device_available()) {
      std::fprintf(stderr, "cuda_qgemv_bench: no CUDA device\n");
      return 1;
    }
    auto be = backend::make_cuda_backend(0);
    // Copy bandwidth (bytes read + written), 1 GiB buffers.
    double copy_bw = 0;
    {
      const int64_t n = int64_t{1} << 30;
      Tensor a = be->alloc(DType::u8, {n}), b = be->alloc(DType::u8, {n});
      be->fill_zero(a);
      be->copy(a, b);
      be->synchronize();
      auto t0 = Clock::now();
      for (int i = 0; i < 10; ++i) be->copy(a, b);
      be->synchronize();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count() / 10;
      copy_bw = 2.0 * n / s;
      std::printf("{\"copy_bw_GBs\": %.1f}\n", copy_bw / 1e9);
    }
    struct Shape {
      const char* name;
      int64_t out, in;
      int per_layer;  // how many per decode step of 32 layers (lm_head: 1)
    };
    const std::vector<Shape> shapes = {{"q_proj/o_proj", 4096, 4096, 64}, {"k_proj/v_proj", 1024, 4096, 64},
                                       {"gate/up_proj", 14336, 4096, 64},  {"down_proj", 4096, 14336, 32},
                                       {"lm_head", 128256, 4096, 1}};
    struct Run {
      int bits, gs, n;
      bool all_shapes;
    };
    const std::vector<Run> runs = {{4, 64, 1, true}, {4, 64, 8, true}, {16, 0, 1, true}, {4, 32, 1, false},
                                   {4, 128, 1, false}, {2, 64, 1, false}, {3, 64, 1, false}, {5, 64, 1, false},
                                   {6, 64, 1, false}, {8, 64, 1, false}};
    std::printf("\n| bits | group | batch | shape | µs | GB/s | fraction of copy bw |\n|---|---|---|---|---|---|---|\n");
    std::string steps;
    for (const Run& r : runs) {
      if ((only_bits && r.bits != only_bits) || (only_batch && r.n != only_batch)) continue;
      double step_s = 0, step_bytes = 0;
      for (const Shape& sh : shapes) {
        if (!r.all_shapes && std::string(sh.name) != "gate/up_proj") continue;
        if (!only_shape.empty() && only_shape != sh.name) continue;
        std::vector<backend::Weight> ws;
        double bytes = 0;
        do {
          ws.push_back(make_weight(*be, sh.out, sh.in, r.bits, r.gs));
          bytes += weight_bytes(ws.back());
        } while (bytes < 384e6);
        const double wb = weight_bytes(ws[0]);
        Tensor xh = Tensor::host(DType::bf16, {r.n, sh.in});
        for (int64_t i = 0; i < xh.numel(); ++i) xh.ptr<uint16_t>()[i] = f32_to_bf16((static_cast<int>(next_u32() % 2001) - 1000) * 1e-3f);
        Tensor x = be->upload(xh), y = be->alloc(DType::bf16, {r.n, sh.out});
        for (auto& w : ws) be->matmul(x, w, y);  // warm-up
        be->synchronize();
        const int n_calls = reps * static_cast<int>(ws.size());
        auto t0 = Clock::now();
        for (int i = 0; i < n_calls; ++i) be->matmul(x, ws[i % ws.size()], y);
        be->synchronize();
        const double s = std::chrono::duration<double>(Clock::now() - t0).count() / n_calls;
        std::printf("{\"bits\": %d, \"group_size\": %d, \"batch\": %d, \"shape\": \"%s\", \"out\": %ld, \"in\": %ld, "
                    "\"us\": %.2f, \"GBs\": %.1f, \"fraction\": %.3f}\n",
                    r.bits, r.gs, r.n, sh.name, static_cast<long>(sh.out), static_cast<long>(sh.in), s * 1e6,
                    wb / s / 1e9, wb / s / copy_bw);
        char line[256];
        std::snprintf(line, sizeof line, "| %s | %d | %d | %s %ldx%ld | %.1f | %.0f | %.0f%% |\n",
                      r.bits == 16 ? "bf16" : std::to_string(r.bits).c_str(), r.gs, r.n, sh.name,
                      static_cast<long>(sh.out), static_cast<long>(sh.in), s * 1e6, wb / s / 1e9,
                      100 * wb / s / copy_bw);
        steps += line;
        step_s += s * sh.per_layer;
        step_bytes += wb * sh.per_layer;
      }
      if (r.all_shapes && only_shape.empty()) {
        char line[256];
        std::snprintf(line, sizeof line,
                      "| %s | %d | %d | **one decode step's projections** | %.1f | %.0f | %.0f%% |\n",
                      r.bits == 16 ? "bf16" : std::to_string(r.bits).c_str(), r.gs, r.n, step_s * 1e6,
                      step_bytes / step_s / 1e9, 100 * step_bytes / step_s / copy_bw);
        steps += line;
      }
    }
    std::printf("%s", steps.c_str());
    std::printf("\ncopy bandwidth %.2f TB/s (read + write, 1 GiB)\n", copy_bw / 1e12);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_qgemv_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
