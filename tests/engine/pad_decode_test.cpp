// Decode batches padded to a bucket (EngineConfig::pad_decode; on by default on the GPU, where it lets
// CUDA graphs be reused across batch sizes) must not change any real sequence: the inert pad rows
// write no KV and their outputs are dropped. Checked on the CPU with stories260K: 6 and 11 sequences
// of different prompt lengths (padded to 8 and 16; the batch shrinks as sequences finish at different
// lengths), greedy and sampled, give the same tokens with padding on and off.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"

using namespace kiln;

namespace {

std::map<int64_t, std::vector<int32_t>> run(engine::LoadedModel& m, engine::EngineConfig::PadDecode pad, int n_seqs,
                                            float temperature, int64_t* steps_tokens) {
  engine::EngineConfig ec;
  ec.scheduler.max_seqs = n_seqs;
  ec.n_blocks = n_seqs * 16;
  ec.pad_decode = pad;
  engine::Engine eng(*m.model, ec);
  std::map<int64_t, std::vector<int32_t>> out;
  for (int s = 0; s < n_seqs; ++s) {
    engine::Request q;
    q.prompt = {1};
    for (int i = 0; i < 2 + 3 * s; ++i) q.prompt.push_back(static_cast<int32_t>(30 + 11 * s + 5 * i));
    q.max_tokens = 12 + 4 * s;  // sequences finish at different steps: the batch shrinks one by one
    q.sampling.temperature = temperature;
    q.sampling.seed = 7 + s;
    q.on_event = [&out](const engine::TokenEvent& e) {
      if (e.token >= 0) out[e.request_id].push_back(e.token);
    };
    eng.add(std::move(q));
  }
  *steps_tokens = 0;
  while (eng.has_work()) *steps_tokens += eng.step();
  return out;
}

TEST(PadDecode, PaddedBatchesGiveTheSameTokens) {
  const char* e = std::getenv("KILN_SHARED_DIR");
  auto m = engine::load_model(std::string(e ? e : KILN_SHARED_DIR) + "/models/stories260K", {});
  for (int n : {6, 11})
    for (float temp : {0.0f, 0.9f}) {
      SCOPED_TRACE(testing::Message() << n << " sequences, temperature " << temp);
      int64_t tok_off = 0, tok_on = 0;
      auto off = run(*m, engine::EngineConfig::PadDecode::off, n, temp, &tok_off);
      auto on = run(*m, engine::EngineConfig::PadDecode::on, n, temp, &tok_on);
      ASSERT_EQ(off.size(), static_cast<size_t>(n));
      EXPECT_EQ(on, off);
      EXPECT_EQ(tok_on, tok_off) << "step() must count real tokens only";
    }
}

}  // namespace
