// The engine on the CUDA backend: batched greedy decoding replays CUDA graphs, allocates no device
// memory once warm, and gives exactly the tokens of the same backend run eagerly (graphs off) —
// the graph is the same kernels on the same addresses, so the results must be identical. Also the
// sampled (temperature) path, which draws on the device (cuda_sampling_test.cpp checks its statistics).
// The rotating cache (max_kv_size): graphs match eager, a sequence holds a bounded number of
// blocks, and its tokens equal a dense reference's (every block kept, the same mask and inputs).
// Grammar masks (structured output) are applied on the device: a constrained step brings back only
// token ids, and its tokens equal the host path's (the same masks applied to downloaded logits).
// Reports SKIPPED where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "kiln/engine/engine.h"
#include "kiln/engine/grammar_constraint.h"
#include "kiln/grammar/grammar_cache.h"
#include "kiln/engine/loader.h"
#include "kiln/engine/model_runner.h"
#ifdef KILN_HAVE_CUDA
#include "kiln/backend/cuda/cuda_backend.h"
#endif

using namespace kiln;

namespace {

std::string shared_dir() {
  const char* e = std::getenv("KILN_SHARED_DIR");
  return e ? e : KILN_SHARED_DIR;
}

struct GenRun {
  std::map<int64_t, std::vector<int32_t>> tokens;
  int64_t mallocs_after_warmup = -1, mallocs_end = -1, replays = 0;
  int max_used = 0;  // blocks held, the most at any step
};

GenRun generate(engine::LoadedModel& m, bool graphs, int n_seqs, int max_tokens, float temperature,
                int max_kv_size = 0) {
  GenRun r;
#ifdef KILN_HAVE_CUDA
  auto& be = static_cast<backend::cuda::CudaBackend&>(*m.backend);
  be.set_graphs_enabled(graphs);
  const int64_t replays0 = be.stats().graph_replays;
#endif
  engine::EngineConfig ec;
  ec.scheduler.max_seqs = n_seqs;
  ec.n_blocks = n_seqs * 16;
  ec.max_kv_size = max_kv_size;
  engine::Engine eng(*m.model, ec);
  for (int s = 0; s < n_seqs; ++s) {
    engine::Request q;
    q.prompt = {1};
    for (int i = 0; i < 3 + 2 * s; ++i) q.prompt.push_back(static_cast<int32_t>(20 + 13 * s + 7 * i));
    q.max_tokens = max_tokens;
    q.sampling.temperature = temperature;
    q.sampling.seed = 42 + s;
    q.on_event = [&r](const engine::TokenEvent& e) {
      if (e.token >= 0) r.tokens[e.request_id].push_back(e.token);
    };
    eng.add(std::move(q));
  }
  int steps = 0;
  while (eng.has_work()) {
    eng.step();
    ++steps;
    r.max_used = std::max(r.max_used, eng.blocks().n_used());
#ifdef KILN_HAVE_CUDA
    if (steps == 12) r.mallocs_after_warmup = be.stats().device_mallocs;
#endif
  }
#ifdef KILN_HAVE_CUDA
  r.mallocs_end = be.stats().device_mallocs;
  r.replays = be.stats().graph_replays - replays0;
#endif
  return r;
}

TEST(CudaEngine, GraphsMatchEagerAndDecodeAllocatesNothing) {
  if (!backend::cuda_device_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  engine::LoadOptions opt;
  opt.device = "cuda";
  auto m = engine::load_model(shared_dir() + "/models/stories260K", opt);
  // 6 sequences of different prompt lengths: prefill steps, then batched decode of 6 (fewer at the end).
  GenRun eager = generate(*m, false, 6, 60, 0.0f);
  GenRun graphed = generate(*m, true, 6, 60, 0.0f);
  EXPECT_EQ(eager.replays, 0);
  EXPECT_GT(graphed.replays, 40) << "decode steps should replay captured graphs";
  ASSERT_EQ(eager.tokens.size(), 6u);
  size_t i = 0;
  for (auto& [id, toks] : graphed.tokens) {
    auto it = std::next(eager.tokens.begin(), static_cast<long>(i++));
    EXPECT_EQ(toks, it->second) << "sequence " << i << ": graph replay differs from eager";
    EXPECT_EQ(toks.size(), 60u);
  }
  EXPECT_EQ(graphed.mallocs_end, graphed.mallocs_after_warmup) << "device memory was allocated on the decode path";
  std::printf("graph replays: %lld; device mallocs after warm-up: %lld\n", static_cast<long long>(graphed.replays),
              static_cast<long long>(graphed.mallocs_end - graphed.mallocs_after_warmup));

  // Sampling at temperature > 0 runs the device sampler after the graph: same seeds, same tokens.
  GenRun s1 = generate(*m, true, 3, 30, 0.8f), s2 = generate(*m, false, 3, 30, 0.8f);
  size_t j = 0;
  for (auto& [id, toks] : s1.tokens) EXPECT_EQ(toks, std::next(s2.tokens.begin(), static_cast<long>(j++))->second);
}

TEST(CudaEngine, RotatingCacheGraphsMatchEagerAndTheDenseReference) {
  if (!backend::cuda_device_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  engine::LoadOptions opt;
  opt.device = "cuda";
  auto m = engine::load_model(shared_dir() + "/models/stories260K", opt);
  // 3 sequences, 300 tokens each past a 64-token rotating cache (16 blocks each would not hold them).
  GenRun eager = generate(*m, false, 3, 300, 0.0f, 64), graphed = generate(*m, true, 3, 300, 0.0f, 64);
  ASSERT_EQ(graphed.tokens.size(), 3u);
  size_t i = 0;
  for (auto& [id, toks] : graphed.tokens) {
    EXPECT_EQ(toks, std::next(eager.tokens.begin(), static_cast<long>(i++))->second) << "sequence " << i;
    EXPECT_EQ(toks.size(), 300u);
  }
  EXPECT_LE(graphed.max_used, 3 * 6);

  // One sequence against the dense reference: the prompt as one chunk, then one token per step,
  // each over a block table as long as the engine's (so the kernels see the same shapes) but with
  // every block kept.
  GenRun one = generate(*m, false, 1, 300, 0.0f, 64);
  EXPECT_LE(one.max_used, 6);
  std::vector<int32_t> tokens = {1, 20, 27, 34};  // generate()'s prompt of sequence 0
  auto kv = model::KvCache::allocate(m->model->backend(), m->config, 32, 16);
  kv.max_kv_size = 64;
  engine::ModelRunner runner(*m->model, kv);
  std::vector<int32_t> blocks(32);
  for (int b = 0; b < 32; ++b) blocks[b] = 31 - b;
  const auto table = [&](int n) { return std::span<const int32_t>(blocks).first((n + 15) / 16); };
  std::vector<int32_t> ref;
  int start = 0, n = static_cast<int>(tokens.size());
  while (ref.size() < 300) {
    engine::SeqChunk c{tokens, start, n, table(start + n), 1, nullptr};
    Tensor l = runner.logits({&c, 1});
    const float* row = l.ptr<float>();
    const int32_t tok = static_cast<int32_t>(std::max_element(row, row + l.numel()) - row);
    ref.push_back(tok);
    tokens.push_back(tok);
    start += n;
    n = 1;
  }
  EXPECT_EQ(one.tokens.begin()->second, ref);
}

}  // namespace

TEST(CudaEngine, GrammarMasksApplyOnTheDevice) {
  if (!backend::cuda_device_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  engine::LoadOptions opt;
  opt.device = "cuda";
  auto m = engine::load_model(shared_dir() + "/models/tiny-llama", opt);
  auto table = grammar::TokenTable::from_tokenizer(*m->tokenizer);
  grammar::GrammarCache cache(table);
  const std::string schema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},)"
                             R"("n":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","b"]}}},)"
                             R"("required":["name","n","tags"]})";
  auto g = cache.get(grammar::Source::json_schema, schema, {}).masker;

  // The runner: one constrained step; device sampling returns ids only, the host path its logits.
  std::vector<int32_t> tokens = m->tokenizer->encode("Once upon a time", true);
  auto run_step = [&](bool device) {
    auto kv = model::KvCache::allocate(m->model->backend(), m->config, 4, 16);
    engine::ModelRunner r(*m->model, kv, engine::RunnerConfig{engine::RunnerConfig::PadDecode::automatic, device});
    engine::GrammarConstraint gc(g, m->eos_ids());
    engine::LogitsProcessor* procs[] = {&gc};
    engine::Sampler sampler(engine::SamplingParams{});
    engine::SampleSpec spec{&sampler, tokens, {}, procs};
    const std::vector<int32_t> blocks{0, 1};
    engine::SeqChunk c{tokens, 0, static_cast<int>(tokens.size()), blocks, 1, &spec};
    return r.run({&c, 1});
  };
  const engine::StepOutput dev = run_step(true), host = run_step(false);
  EXPECT_EQ(dev.logits.data, nullptr) << "a constrained step downloaded its logits";
  EXPECT_EQ(dev.row_ids.size(), 1u) << "only the token id should come back";
  ASSERT_NE(host.logits.data, nullptr);
  EXPECT_EQ(dev.tokens[0], host.tokens[0]);
  EXPECT_EQ(table->bytes(dev.tokens[0]).front(), '{');

  // The engine, greedy, 6 sequences batched: the same tokens through device masks and the host path.
  auto generate_json = [&](bool device, float temperature) {
    engine::EngineConfig ec;
    ec.device_sampling = device;
    engine::Engine eng(*m->model, ec);
    std::map<int64_t, std::vector<int32_t>> out;
    for (int s = 0; s < 6; ++s) {
      engine::Request q;
      q.prompt = tokens;
      q.prompt.push_back(static_cast<int32_t>(30 + 17 * s));
      q.max_tokens = 60;
      q.stop_ids = m->eos_ids();
      q.sampling.temperature = temperature;
      q.sampling.seed = 7 + s;
      q.grammar = g;
      q.on_event = [&out](const engine::TokenEvent& e) {
        if (e.token >= 0) out[e.request_id].push_back(e.token);
      };
      eng.add(std::move(q));
    }
    while (eng.has_work()) eng.step();
    return out;
  };
  const auto dg = generate_json(true, 0.0f), hg = generate_json(false, 0.0f);
  ASSERT_EQ(dg.size(), 6u);
  size_t i = 0;
  for (auto& [id, toks] : dg) EXPECT_EQ(toks, std::next(hg.begin(), static_cast<long>(i++))->second) << "sequence " << i;
  // Sampled on the device: every output is a prefix the grammar accepts (or the whole object).
  const std::vector<int32_t> eos = m->eos_ids();
  for (auto& [id, toks] : generate_json(true, 1.0f)) {
    grammar::Matcher mt(g->grammar());
    for (int32_t t : toks) {
      if (std::find(eos.begin(), eos.end(), t) != eos.end()) continue;
      ASSERT_TRUE(mt.accept_bytes(table->bytes(t))) << "sequence " << id << ": a token the grammar refuses";
    }
  }
}
