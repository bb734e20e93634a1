// model_bench: prefill and decode throughput of one model through the engine (the path
// `kiln generate` and the server use), and the bytes one decode token reads.
// Usage: model_bench [--model DIR] [--prefill N] [--decode N] [--batch B] [--repeat R]
// Prints one JSON object per line: {"model", "prefill_tokens", "prefill_tok_s", "decode_tok_s", ...}.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "kiln/base/json.h"
#include "kiln/cli/embedded.h"
#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

// Bytes of weights one decode token streams: every tensor except the embedding table
// (one row is gathered), plus the head (which may be the tied embedding).
double weight_bytes_per_token(const engine::LoadedModel& m) {
  double b = 0;
  for (auto& name : m.weights.names()) {
    if (name == "model.embed_tokens.weight") continue;
    b += static_cast<double>(m.weights.get(name).nbytes());
  }
  if (!m.weights.has("lm_head.weight")) b += static_cast<double>(m.weights.get("model.embed_tokens.weight").nbytes());
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  int prefill = 128, decode = 64, batch = 1, repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--model") model = argv[i + 1];
    else if (k == "--prefill") prefill = std::atoi(argv[i + 1]);
    else if (k == "--decode") decode = std::atoi(argv[i + 1]);
    else if (k == "--batch") batch = std::atoi(argv[i + 1]);
    else if (k == "--repeat") repeat = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  try {
    auto m = model.empty() ? engine::load_model_from_memory(cli::embedded_model_files(), cli::kEmbeddedName)
                           : engine::load_model(model);
    const auto& c = m->config;
    prefill = std::min(prefill, c.max_position_embeddings - decode - 1);
    double best_prefill = 1e30, best_decode = 1e30;
    for (int rep = 0; rep < repeat; ++rep) {
      engine::EngineConfig ec;
      ec.scheduler.max_seqs = batch;
      ec.scheduler.max_batch_tokens = std::max(prefill, batch);
      ec.n_blocks = batch * ((prefill + decode) / ec.block_size + 2);
      engine::Engine eng(*m->model, ec);
      for (int s = 0; s < batch; ++s) {
        engine::Request r;
        for (int i = 0; i < prefill; ++i) r.prompt.push_back(static_cast<int32_t>((i * 7919 + s * 31 + 3) % c.vocab_size));
        r.max_tokens = decode;  // no stop ids: exactly `decode` tokens
        eng.add(std::move(r));
      }
      // Prefill: run steps until every sequence has produced its first token.
      auto t0 = Clock::now();
      while (eng.stats().generated_tokens < batch) eng.step();
      auto t1 = Clock::now();
      while (eng.has_work()) eng.step();
      auto t2 = Clock::now();
      best_prefill = std::min(best_prefill, std::chrono::duration<double>(t1 - t0).count());
      best_decode = std::min(best_decode, std::chrono::duration<double>(t2 - t1).count());
    }
    double wb = weight_bytes_per_token(*m);
    // KV bytes read per decode token at the mean context (K and V, f32 on the CPU).
    double kv = 2.0 * c.n_layers * c.n_kv_heads * c.head_dim * 4 * (prefill + decode / 2.0);
    Json j = {{"model", model.empty() ? "stories260K (embedded)" : model},
              {"prefill_tokens", prefill},
              {"batch", batch},
              {"prefill_tok_s", batch * prefill / best_prefill},
              {"decode_steps", decode - 1},
              {"decode_tok_s", batch * (decode - 1) / best_decode},
              {"weight_bytes_per_step", wb},
              {"kv_bytes_per_token", kv},
              {"bytes_per_decode_step", wb + batch * kv}};
    std::printf("%s\n", j.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
