// decode_bench: batch-1 decode tok/s of a model folder on the CPU through the engine's ModelRunner
// (no tokenizer, scheduler or sampling beyond greedy): prefill P tokens,
// then time D single-token steps; reports the best of R runs (this machine's timing is noisy).
// Usage: decode_bench --model DIR [--prefill 32] [--decode 32] [--repeat 5]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/engine/model_runner.h"
#include "kiln/model/model.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  std::string dir;
  int prefill = 32, decode = 32, repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--model") dir = argv[i + 1];
    else if (k == "--prefill") prefill = std::atoi(argv[i + 1]);
    else if (k == "--decode") decode = std::atoi(argv[i + 1]);
    else if (k == "--repeat") repeat = std::atoi(argv[i + 1]);
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: decode_bench --model DIR [--prefill N] [--decode N] [--repeat R]\n");
    return 2;
  }
  try {
    auto cfg = model::ModelConfig::load_dir(dir);
    auto ws = io::WeightSet::open_dir(dir);
    auto be = backend::make_cpu_backend();
    auto m = model::create_model(cfg, ws, *be);
    const int block = 16, n_blocks = (prefill + decode) / block + 2;
    double best = 1e30;
    for (int r = 0; r < repeat; ++r) {
      auto kv = model::KvCache::allocate(*be, cfg, n_blocks, block);
      engine::ModelRunner runner(*m, kv);
      std::vector<int32_t> tokens(prefill + decode), blocks(n_blocks);
      for (int p = 0; p < prefill + decode; ++p) tokens[p] = (p * 7919 + 3) % cfg.vocab_size;
      for (int i = 0; i < n_blocks; ++i) blocks[i] = i;
      engine::Sampler greedy({});
      engine::SampleSpec spec;
      spec.sampler = &greedy;
      auto step = [&](int begin, int end, int32_t first) {  // greedy: the last position's argmax
        tokens[begin] = first;
        engine::SeqChunk c{tokens, begin, end - begin, blocks, 1, &spec};
        return runner.run({&c, 1}).tokens[0];
      };
      int32_t tok = step(0, prefill, 1);
      auto t0 = Clock::now();
      for (int i = 0; i < decode; ++i) tok = step(prefill + i, prefill + i + 1, tok);
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::printf("{\"model\": \"%s\", \"decode_tokens\": %d, \"best_decode_tok_s\": %.2f}\n", dir.c_str(), decode,
                decode / best);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
