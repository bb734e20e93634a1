// model_bench: prefill and decode throughput of one model through the engine (the path
// `kiln generate` and the server use), and the bytes one decode token reads.
// Usage: model_bench [--model DIR] [--device cpu|cuda] [--prefill N] [--decode N] [--batch B] [--repeat R]
//                    [--plan B:P:D,B:P:D,...]   (several runs over one loaded model; overrides the above)
//                    [--kv-bits 8|4 [--kv-group-size G]]   (a quantized KV cache; kv_bytes_per_token follows it)
//                    [--json-schema FILE]   (every request constrained by the schema: structured output's cost;
//                                            a sequence whose JSON completes ends early, so decode_tok_s counts
//                                            the tokens actually generated)
// Prints one JSON object per line: {"model", "prefill_tokens", "prefill_tok_s", "decode_tok_s", ...}.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "kiln/backend/kv_quant.h"
#include "kiln/base/json.h"
#include "kiln/base/mapped_file.h"
#include "kiln/cli/embedded.h"
#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/grammar/grammar_cache.h"
#ifdef KILN_HAVE_CUDA
#include "kiln/backend/cuda/cuda_backend.h"
#endif

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

struct PlanEntry {
  int batch, prefill, decode;
};

int main(int argc, char** argv) {
  std::string model, device = "cpu", plan_arg, schema_file;
  int kv_bits = 0, kv_group = 64;
  int prefill = 128, decode = 64, batch = 1, repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--model") model = argv[i + 1];
    else if (k == "--prefill") prefill = std::atoi(argv[i + 1]);
    else if (k == "--decode") decode = std::atoi(argv[i + 1]);
    else if (k == "--batch") batch = std::atoi(argv[i + 1]);
    else if (k == "--repeat") repeat = std::atoi(argv[i + 1]);
    else if (k == "--device") device = argv[i + 1];
    else if (k == "--plan") plan_arg = argv[i + 1];
    else if (k == "--kv-bits") kv_bits = std::atoi(argv[i + 1]);
    else if (k == "--kv-group-size") kv_group = std::atoi(argv[i + 1]);
    else if (k == "--json-schema") schema_file = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  try {
    engine::LoadOptions opt;
    opt.device = device;
    opt.kv_bits = kv_bits;
    opt.kv_group_size = kv_group;
    auto m = model.empty() ? engine::load_model_from_memory(cli::embedded_model_files(), cli::kEmbeddedName, opt)
                           : engine::load_model(model, opt);
    const auto& c = m->config;
    std::shared_ptr<const grammar::TokenMasker> schema;
    if (!schema_file.empty()) {
      grammar::GrammarCache gc(grammar::TokenTable::from_tokenizer(*m->tokenizer));
      schema = gc.get(grammar::Source::json_schema, read_file(schema_file, "model_bench"), {}).masker;
    }
    std::vector<PlanEntry> plan;
    for (size_t pos = 0; pos < plan_arg.size();) {
      size_t end = plan_arg.find(',', pos);
      if (end == std::string::npos) end = plan_arg.size();
      PlanEntry e{};
      if (std::sscanf(plan_arg.substr(pos, end - pos).c_str(), "%d:%d:%d", &e.batch, &e.prefill, &e.decode) != 3) {
        std::fprintf(stderr, "--plan entries are BATCH:PREFILL:DECODE\n");
        return 2;
      }
      plan.push_back(e);
      pos = end + 1;
    }
    if (plan.empty()) plan.push_back({batch, prefill, decode});
    for (const PlanEntry& pe : plan) {
    batch = pe.batch, prefill = pe.prefill, decode = pe.decode;
    prefill = std::min(prefill, c.max_position_embeddings - decode - 1);
    double best_prefill = 1e30, best_decode = 1e30;
    int64_t decode_tokens = static_cast<int64_t>(batch) * (decode - 1);  // (of the best run)
#ifdef KILN_HAVE_CUDA
    auto* cb = dynamic_cast<backend::cuda::CudaBackend*>(m->backend.get());
    const backend::cuda::CudaStats st0 = cb ? cb->stats() : backend::cuda::CudaStats{};
#endif
    for (int rep = 0; rep < repeat; ++rep) {
      engine::EngineConfig ec;
      ec.scheduler.max_seqs = batch;
      // Every prompt fits one step, so all sequences start decoding together: the decode phase is a
      // steady batch of `batch` sequences (as the PyTorch peers run it), not a staggered one.
      ec.scheduler.max_batch_tokens = std::max(prefill * batch, batch);
      ec.n_blocks = batch * ((prefill + decode) / ec.block_size + 2);
      engine::Engine eng(*m->model, ec);
      for (int s = 0; s < batch; ++s) {
        engine::Request r;
        for (int i = 0; i < prefill; ++i) r.prompt.push_back(static_cast<int32_t>((i * 7919 + s * 31 + 3) % c.vocab_size));
        r.max_tokens = decode;  // no stop ids: exactly `decode` tokens (unless a schema completes)
        r.grammar = schema;
        eng.add(std::move(r));
      }
      // Prefill: run steps until every sequence has produced its first token.
      auto t0 = Clock::now();
      while (eng.stats().generated_tokens < batch) eng.step();
      auto t1 = Clock::now();
      while (eng.has_work()) eng.step();
      auto t2 = Clock::now();
      best_prefill = std::min(best_prefill, std::chrono::duration<double>(t1 - t0).count());
      const double dt = std::chrono::duration<double>(t2 - t1).count();
      if (dt < best_decode) best_decode = dt, decode_tokens = eng.stats().generated_tokens - batch;
    }
    double wb = weight_bytes_per_token(*m);
    // KV bytes read per decode token at the mean context (K and V: activation dtype, or codes + f16 scales/biases).
    const double kv_row = static_cast<double>(backend::kv_row_bytes(m->model->config().kv_quant,
                                                                    int64_t{c.n_kv_heads} * c.head_dim,
                                                                    dtype_size(m->backend->act_dtype())));
    double kv = 2.0 * c.n_layers * kv_row * (prefill + decode / 2.0);
    Json j = {{"model", model.empty() ? "stories260K (embedded)" : model},
              {"device", m->backend->name()},
              {"kv_bits", m->model->config().kv_quant.bits},
              {"prefill_tokens", prefill},
              {"batch", batch},
              {"prefill_tok_s", batch * prefill / best_prefill},
              {"decode_steps", decode - 1},
              {"decode_tok_s", static_cast<double>(decode_tokens) / best_decode},
              {"decode_tokens", decode_tokens},
              {"json_schema", schema_file},
              {"weight_bytes_per_step", wb},
              {"kv_bytes_per_token", kv},
              {"bytes_per_decode_step", wb + batch * kv}};
#ifdef KILN_HAVE_CUDA
    if (cb) {  // over this entry's runs: graph use, and allocations outside the arena (should stay 0 when warm)
      const backend::cuda::CudaStats& st = cb->stats();
      j["graph_captures"] = st.graph_captures - st0.graph_captures;
      j["graph_replays"] = st.graph_replays - st0.graph_replays;
      j["device_mallocs"] = st.device_mallocs - st0.device_mallocs;
      j["arena_overflows"] = st.arena_overflows - st0.arena_overflows;
      j["decoder_stacks"] = st.fused_decoders - st0.fused_decoders;  // eager and captured steps only
    }
#endif
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    }
#ifdef KILN_HAVE_CUDA
    // KILN_CUDA_PROFILE=1: per-op device time over all the runs above (graphs off while profiling).
    if (auto* cb = dynamic_cast<backend::cuda::CudaBackend*>(m->backend.get()); cb && std::getenv("KILN_CUDA_PROFILE"))
      std::fprintf(stderr, "%s", cb->profile_report().c_str());
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
