// kv_tier_bench: time to first token of one prompt (random token ids) through the engine — cold
// (nothing cached; once with the SSD tier off, once on: its writes are part of the cold run), a RAM
// prefix-cache hit (the same engine again), and an SSD hit (a new engine on the folder the first
// wrote, as after a restart; the files are read through the page cache when it still holds them,
// so with --drop-caches the kernel's caches are dropped first where permitted); then decode tok/s
// with the tier off and on. Ratios from one run.
// Usage: kv_tier_bench --model DIR [--device cpu|cuda] [--prompt 2048,8192] [--decode 128]
//                      [--dir /tmp/kiln-tier-bench] [--drop-caches]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "kiln/engine/engine.h"
#include "kiln/engine/kv_sizing.h"
#include "kiln/engine/loader.h"

using namespace kiln;
using namespace kiln::engine;
using Clock = std::chrono::steady_clock;

namespace {

struct Timing {
  double ttft = 0, decode_tps = 0;
  int cached = 0, cached_ssd = 0;
};

Timing run(Engine& eng, const std::vector<int32_t>& prompt, int max_tokens) {
  Timing t;
  Clock::time_point t0 = Clock::now(), first, last;
  int n = 0;
  Request r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.on_event = [&](const TokenEvent& e) {
    if (e.token < 0) return;
    last = Clock::now();
    if (n++ == 0) {
      first = last;
      t.cached = e.n_cached;
      t.cached_ssd = e.n_cached_ssd;
    }
  };
  eng.add(std::move(r));
  while (eng.has_work()) eng.step();
  eng.model().backend().synchronize();
  t.ttft = std::chrono::duration<double>(first - t0).count();
  if (n > 1) t.decode_tps = (n - 1) / std::chrono::duration<double>(last - first).count();
  return t;
}

EngineConfig config(const LoadedModel& m, int n_tokens, const std::string& ssd_dir) {
  EngineConfig ec;
  ec.scheduler.max_seqs = 1;
  ec.n_blocks = n_tokens / ec.block_size + 4;
  ec.prompt_cache_bytes = kv_bytes_per_block(*m.model, ec.block_size) * ec.n_blocks;
  ec.gpu_memory_utilization = 0.9;
  ec.model_key = m.cache_key();
  ec.ssd.dir = ssd_dir;
  ec.ssd.max_bytes = 1ull << 40;
  return ec;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, device = "cpu", dir = "/tmp/kiln-tier-bench", prompts = "2048";
  int decode = 128;
  bool drop = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--model") model = next();
    else if (a == "--device") device = next();
    else if (a == "--prompt") prompts = next();
    else if (a == "--decode") decode = std::atoi(next().c_str());
    else if (a == "--dir") dir = next();
    else if (a == "--drop-caches") drop = true;
    else {
      std::fprintf(stderr, "usage: kv_tier_bench --model DIR [--device cpu|cuda] [--prompt 2048,8192] [--decode 128] "
                           "[--dir D] [--drop-caches]\n");
      return 2;
    }
  }
  auto m = load_model(model, {.device = device});
  std::printf("model %s on %s; block files under %s\n", m->path.c_str(), device.c_str(), dir.c_str());
  std::printf("%8s %10s %10s %10s %10s %12s %8s %8s\n", "prompt", "cold_off", "cold_on", "ram_hit", "ssd_hit",
              "cold/ssd", "cached%", "GB/s");
  std::stringstream list(prompts);
  for (std::string x; std::getline(list, x, ',');) {
    const int n = std::atoi(x.c_str());
    std::mt19937 g(n);
    std::vector<int32_t> prompt(n);
    for (int32_t& t : prompt) t = static_cast<int32_t>(10 + g() % (m->config.vocab_size - 10));
    std::filesystem::remove_all(dir);
    Timing off, on, ram, ssd;
    {
      Engine eng(*m->model, config(*m, n + 8, ""));
      run(eng, std::vector<int32_t>(prompt.begin(), prompt.begin() + std::min(n, 64)), 1);  // warm-up
      off = run(eng, prompt, 1);
    }
    {
      Engine eng(*m->model, config(*m, n + 8, dir));
      on = run(eng, prompt, 1);
      ram = run(eng, prompt, 1);
    }  // (the engine's end waits for its writes)
    bool dropped = false;
    if (drop) {
      std::ofstream f("/proc/sys/vm/drop_caches");
      dropped = static_cast<bool>(f << "3\n");
    }
    uint64_t bytes = 0;
    {
      Engine eng(*m->model, config(*m, n + 8, dir));
      bytes = static_cast<uint64_t>(eng.ssd()->stats().bytes);
      ssd = run(eng, prompt, 1);
    }
    std::printf("%8d %9.1fms %9.1fms %9.1fms %9.1fms %11.1fx %7.0f%% %8.2f%s\n", n, off.ttft * 1e3, on.ttft * 1e3,
                ram.ttft * 1e3, ssd.ttft * 1e3, off.ttft / ssd.ttft, 100.0 * ssd.cached_ssd / n,
                bytes / 1e9 / ssd.ttft, drop ? (dropped ? " (caches dropped)" : " (drop_caches refused)") : "");
  }
  // Decode with the tier off and on: a 512-token prompt (less where the context is short), then `decode` tokens (a block completes,
  // and is written, every 16).
  std::mt19937 g(7);
  const int n_decode_prompt = std::min(512, m->config.max_position_embeddings - decode - 8);
  std::vector<int32_t> prompt(n_decode_prompt);
  for (int32_t& t : prompt) t = static_cast<int32_t>(10 + g() % (m->config.vocab_size - 10));
  std::filesystem::remove_all(dir);
  double tps[2];
  for (int on = 0; on < 2; ++on) {
    Engine eng(*m->model, config(*m, n_decode_prompt + decode + 8, on ? dir : ""));
    run(eng, std::vector<int32_t>(prompt.begin(), prompt.begin() + 64), 8);  // warm-up (graphs)
    tps[on] = run(eng, prompt, decode).decode_tps;
  }
  std::printf("decode %d tokens after %d: tier off %.1f tok/s, on %.1f tok/s (on/off %.3f)\n", decode, n_decode_prompt, tps[0], tps[1],
              tps[1] / tps[0]);
  std::filesystem::remove_all(dir);
  return 0;
}
