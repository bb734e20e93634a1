// EngineThread without a real model: a fake Model whose logits always favour (token + 1) % vocab
// drives the queue, the events on each Channel, cancellation (one choice or all of a channel),
// refused requests, a failing step (every open request ends with an error), and shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "kiln/engine/engine_thread.h"

using namespace kiln;
using namespace kiln::engine;
using namespace std::chrono_literals;

namespace {

// vocab 16, context 64; forward sleeps `delay` per step and throws while `fail` is set.
class FakeModel final : public model::Model {
 public:
  explicit FakeModel(backend::Backend& be) : Model(config(), be) {}
  static model::ModelConfig config() {
    model::ModelConfig c;
    c.model_type = "fake";
    c.dim = 4, c.n_layers = 1, c.n_heads = 1, c.n_kv_heads = 1, c.head_dim = 4, c.ffn_dim = 4;
    c.vocab_size = 16;
    c.max_position_embeddings = 64;
    return c;
  }
  Tensor forward(const model::StepInputs& in, model::KvCache&) override {
    if (fail) kiln::fail("fake", "the forward failed");
    std::this_thread::sleep_for(delay);
    Tensor l = backend_->alloc(DType::f32, {in.n_out, 16});
    for (int r = 0; r < in.n_out; ++r) {
      const int32_t tok = in.tokens.ptr<int32_t>()[in.logit_rows.ptr<int32_t>()[r]];
      for (int v = 0; v < 16; ++v) l.ptr<float>()[r * 16 + v] = v == (tok + 1) % 16 ? 1.0f : 0.0f;
    }
    return l;
  }
  std::atomic<bool> fail{false};
  std::chrono::milliseconds delay{0};
};

struct Fixture {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  FakeModel model{*be};
  Engine engine{model, [] {
                  EngineConfig ec;
                  ec.n_blocks = 64;
                  return ec;
                }()};
};

Request request(std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

// Every item until `n_finished` choices have finished (or 5 s pass).
std::vector<Channel::Item> drain(Channel& ch, int n_finished) {
  std::vector<Channel::Item> all;
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (n_finished > 0 && std::chrono::steady_clock::now() < end)
    for (auto& it : ch.pop(50ms)) {
      n_finished -= it.event.finished;
      all.push_back(std::move(it));
    }
  return all;
}

}  // namespace

TEST(EngineThread, RunsRequestsAndTagsEventsByChoice) {
  Fixture f;
  EngineThread et(f.engine);
  auto ch = std::make_shared<Channel>();
  et.submit(request({3}, 4), ch, 0);
  et.submit(request({10, 11}, 3), ch, 1);
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, FinishReason> reasons;
  for (auto& it : drain(*ch, 2)) {
    if (it.event.token >= 0) tokens[it.choice].push_back(it.event.token);
    if (it.event.finished) reasons[it.choice] = it.event.reason;
  }
  EXPECT_EQ(tokens[0], (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(tokens[1], (std::vector<int32_t>{12, 13, 14}));
  EXPECT_EQ(reasons[0], FinishReason::length);
  EXPECT_EQ(reasons[1], FinishReason::length);
  // The snapshot catches up after the last step: everything done, no block in use.
  for (int i = 0; i < 100 && et.snapshot().generated_tokens < 7; ++i) std::this_thread::sleep_for(10ms);
  const EngineSnapshot s = et.snapshot();
  EXPECT_EQ(s.generated_tokens, 7);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.queued, 0);
  EXPECT_EQ(s.blocks_used, 0);
}

TEST(EngineThread, RefusedRequestEndsAtOnceWithAnError) {
  Fixture f;
  EngineThread et(f.engine);
  auto ch = std::make_shared<Channel>();
  et.submit(request({}, 4), ch, 0);       // empty prompt
  et.submit(request({99}, 4), ch, 1);     // outside the vocabulary
  auto items = drain(*ch, 2);
  ASSERT_EQ(items.size(), 2u);
  for (auto& it : items) {
    EXPECT_TRUE(it.event.finished);
    EXPECT_EQ(it.event.reason, FinishReason::error);
    EXPECT_NE(it.event.error.find("[engine]"), std::string::npos) << it.event.error;
  }
}

TEST(EngineThread, CancelEndsOneChoiceOrAllOfAChannel) {
  Fixture f;
  f.model.delay = 2ms;
  EngineThread et(f.engine);
  auto a = std::make_shared<Channel>(), b = std::make_shared<Channel>();
  et.submit(request({1}, 60), a, 0);
  et.submit(request({2}, 60), a, 1);
  et.submit(request({5}, 6), b, 0);
  std::this_thread::sleep_for(20ms);
  et.cancel(a, 1);
  // b runs to its end while a's choice 0 keeps going.
  auto bi = drain(*b, 1);
  ASSERT_FALSE(bi.empty());
  EXPECT_EQ(bi.back().event.reason, FinishReason::length);
  et.cancel(a);  // the rest of a
  std::map<int, FinishReason> reasons;
  for (auto& it : drain(*a, 2))
    if (it.event.finished) reasons[it.choice] = it.event.reason;
  EXPECT_EQ(reasons[0], FinishReason::cancelled);
  EXPECT_EQ(reasons[1], FinishReason::cancelled);
  for (int i = 0; i < 100 && et.snapshot().running > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(et.snapshot().blocks_used, 0);  // cancelled requests gave their KV blocks back
}

TEST(EngineThread, FailedStepEndsEveryOpenRequestAndKeepsServing) {
  Fixture f;
  EngineThread et(f.engine);
  f.model.fail = true;
  auto ch = std::make_shared<Channel>();
  et.submit(request({1}, 5), ch, 0);
  et.submit(request({2}, 5), ch, 1);
  auto items = drain(*ch, 2);
  int errors = 0;
  for (auto& it : items)
    if (it.event.finished && it.event.reason == FinishReason::error) {
      ++errors;
      EXPECT_NE(it.event.error.find("the forward failed"), std::string::npos) << it.event.error;
    }
  EXPECT_EQ(errors, 2);
  f.model.fail = false;  // the next request runs normally
  auto next = std::make_shared<Channel>();
  et.submit(request({7}, 2), next, 0);
  auto ok = drain(*next, 1);
  ASSERT_FALSE(ok.empty());
  EXPECT_EQ(ok.back().event.reason, FinishReason::length);
  EXPECT_EQ(ok.back().event.token, 9);
}

TEST(EngineThread, ShutdownEndsOpenRequestsWithAnError) {
  Fixture f;
  f.model.delay = 2ms;
  auto ch = std::make_shared<Channel>();
  {
    EngineThread et(f.engine);
    et.submit(request({1}, 60), ch, 0);
    std::this_thread::sleep_for(20ms);
  }  // the destructor stops the loop
  auto items = drain(*ch, 1);
  ASSERT_FALSE(items.empty());
  EXPECT_TRUE(items.back().event.finished);
  EXPECT_EQ(items.back().event.reason, FinishReason::error);
  EXPECT_NE(items.back().event.error.find("shutting down"), std::string::npos);
  EXPECT_FALSE(f.engine.has_work());
}
