// Speculative decoding with the real models of ../shared/models, on the device KILN_SPEC_DEVICE
// and the suite name KILN_SPEC_SUITE (speculative_test.cpp: the CPU, Speculative;
// cuda_speculative_test.cpp: CUDA, CudaSpeculative, skipped without a GPU): greedy output is the
// same token for token with and without drafting, for stories260K drafting itself, llama2xs-280K
// (another model, one tokenizer) drafting for stories260K, and prompt lookup; EOS and max_tokens
// inside an accepted burst end the output where plain decoding ends it; 8 concurrent drafted
// requests each equal their solo plain output; aidreams260K (another tokenizer) is refused; and
// at temperature 1 the drafted token's empirical distribution over many seeds matches the
// target's probabilities (chi-square), under both acceptance rules.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "kiln/base/error.h"
#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/engine/speculative.h"

using namespace kiln;
using namespace kiln::engine;

namespace {

std::string shared_dir() {
  const char* e = std::getenv("KILN_SHARED_DIR");
  return e ? e : KILN_SHARED_DIR;
}

std::unique_ptr<LoadedModel> load(const std::string& name) {
  return load_model(shared_dir() + "/models/" + name, {.device = KILN_SPEC_DEVICE});
}

}  // namespace

class KILN_SPEC_SUITE : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(KILN_SPEC_DEVICE) == "cuda" && !backend::cuda_device_available())
      GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  }
};

namespace {

struct Models {
  std::unique_ptr<LoadedModel> target = load("stories260K");
  std::unique_ptr<LoadedModel> self = load("stories260K");
  std::unique_ptr<LoadedModel> xs = load("llama2xs-280K");
};
Models& models() {
  static Models m;
  return m;
}

const char* kPrompts[] = {"Once upon a time", "Lily and Tom went to the park. Lily saw a big red ball", "The cat",
                          "One day, a little bird", "Tim had a toy car. He loved his toy car", "The sun was hot",
                          "Sam and his mom baked a cake", "Anna found a shiny stone in the garden"};

std::vector<int32_t> encode(const char* text) { return models().target->tokenizer->encode(text, true); }

struct Output {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::none;
  int draft_n = 0, draft_n_accepted = 0;
};

// Runs the requests to the end in one engine (max_seqs = their count); the outputs in order.
std::vector<Output> run(std::vector<Request> reqs, DraftSource* draft, int n_draft, bool adaptive = false,
                     SpecAccept accept = SpecAccept::residual) {
  EngineConfig ec;
  ec.scheduler.max_seqs = static_cast<int>(reqs.size());
  ec.spec = {draft, n_draft, accept, adaptive};
  Engine eng(*models().target->model, ec);
  std::vector<Output> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].on_event = [&out, i](const TokenEvent& e) {
      ASSERT_FALSE(out[i].reason != FinishReason::none) << "an event after the last";
      if (e.token >= 0) out[i].tokens.push_back(e.token);
      if (e.finished) out[i].reason = e.reason;
      out[i].draft_n = e.draft_n;
      out[i].draft_n_accepted = e.draft_n_accepted;
    };
    eng.add(std::move(reqs[i]));
  }
  while (eng.has_work()) eng.step();
  EXPECT_EQ(eng.stats().draft_tokens, [&] {
    int64_t n = 0;
    for (const Output& r : out) n += r.draft_n;
    return n;
  }());
  return out;
}

Request greedy(const char* prompt, int max_tokens, std::vector<int32_t> stop = {2}) {
  Request r;
  r.prompt = encode(prompt);
  r.max_tokens = max_tokens;
  r.stop_ids = std::move(stop);
  return r;
}

Output solo(Request r, DraftSource* draft = nullptr, int n = 0, bool adaptive = false) {
  std::vector<Request> v;
  v.push_back(std::move(r));
  return run(std::move(v), draft, n, adaptive)[0];
}

double acceptance(const Output& r) { return r.draft_n ? static_cast<double>(r.draft_n_accepted) / r.draft_n : 0.0; }

}  // namespace

TEST_F(KILN_SPEC_SUITE, SelfDraftingGivesTheSameTokensAndAcceptsAll) {
  auto draft = make_draft_model(*models().self, *models().target);
  for (const char* p : kPrompts) {
    const Output plain = solo(greedy(p, 200));
    for (int n : {1, 3, 6}) {
      const Output spec = solo(greedy(p, 200), draft.get(), n);
      EXPECT_EQ(spec.tokens, plain.tokens) << p << " n=" << n;
      EXPECT_EQ(spec.reason, plain.reason);
      EXPECT_GT(spec.draft_n, 0);
      EXPECT_GT(acceptance(spec), 0.97) << p << " n=" << n;  // one model: every draft is the target's choice
    }
  }
}

TEST_F(KILN_SPEC_SUITE, AnotherDraftModelGivesTheSameTokens) {
  auto draft = make_draft_model(*models().xs, *models().target);
  int64_t drafted = 0, accepted = 0;
  for (const char* p : kPrompts) {
    // 300 tokens pass llama2xs-280K's 256-token context: the rest decodes without drafts.
    const Output plain = solo(greedy(p, 300, {}));
    for (bool adaptive : {false, true}) {
      const Output spec = solo(greedy(p, 300, {}), draft.get(), 3, adaptive);
      EXPECT_EQ(spec.tokens, plain.tokens) << p;
      drafted += spec.draft_n;
      accepted += spec.draft_n_accepted;
    }
  }
  const double rate = static_cast<double>(accepted) / drafted;
  EXPECT_GT(rate, 0.05);
  EXPECT_LT(rate, 0.9);  // two different models: well below 1
}

TEST_F(KILN_SPEC_SUITE, PromptLookupGivesTheSameTokens) {
  auto draft = make_ngram_draft(2, 4);
  int64_t drafted = 0;
  for (const char* p : kPrompts) {
    const Output plain = solo(greedy(p, 250));
    const Output spec = solo(greedy(p, 250), draft.get(), 4);
    EXPECT_EQ(spec.tokens, plain.tokens) << p;
    drafted += spec.draft_n;
  }
  EXPECT_GT(drafted, 0);
}

TEST_F(KILN_SPEC_SUITE, EosAndMaxTokensInsideABurstEndWherePlainDecodingEnds) {
  auto draft = make_draft_model(*models().self, *models().target);
  const Output plain = solo(greedy(kPrompts[0], 60, {}));
  ASSERT_EQ(plain.tokens.size(), 60u);
  // Self-drafting accepts every draft, so with n = 5 each verify emits 6 tokens: every max_tokens
  // and every stop position below falls inside some burst.
  for (int max_tokens = 1; max_tokens <= 14; ++max_tokens) {
    const Output spec = solo(greedy(kPrompts[0], max_tokens, {}), draft.get(), 5);
    EXPECT_EQ(spec.tokens, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + max_tokens));
    EXPECT_EQ(spec.reason, FinishReason::length);
  }
  for (int at = 2; at < 14; ++at) {
    const int32_t stop = plain.tokens[at];
    const int first = static_cast<int>(std::find(plain.tokens.begin(), plain.tokens.end(), stop) - plain.tokens.begin());
    const Output spec = solo(greedy(kPrompts[0], 60, {stop}), draft.get(), 5);
    EXPECT_EQ(spec.tokens, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + first + 1)) << at;
    EXPECT_EQ(spec.reason, FinishReason::stop);
  }
}

TEST_F(KILN_SPEC_SUITE, EightConcurrentDraftedRequestsEachEqualTheirSoloOutput) {
  auto xs = make_draft_model(*models().xs, *models().target);
  auto ngram = make_ngram_draft(2, 4);
  for (DraftSource* d : {xs.get(), ngram.get()}) {
    std::vector<Request> reqs;
    std::vector<Output> alone;
    for (int i = 0; i < 8; ++i) {
      reqs.push_back(greedy(kPrompts[i], 40 + 20 * i));
      alone.push_back(solo(greedy(kPrompts[i], 40 + 20 * i)));
    }
    reqs[3].num_draft_tokens = 0;  // one request opts out
    reqs[5].num_draft_tokens = 1;
    const std::vector<Output> together = run(std::move(reqs), d, 3, true);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << d->name() << " request " << i;
    EXPECT_EQ(together[3].draft_n, 0);
  }
}

TEST_F(KILN_SPEC_SUITE, LogprobsComeOnePerTokenAndEqualPlainDecodings) {
  auto draft = make_draft_model(*models().self, *models().target);
  auto logprobs = [&](DraftSource* d) {
    Request r = greedy(kPrompts[1], 30);
    r.logprobs = 2;
    std::vector<std::pair<int32_t, float>> lp;
    r.on_event = [&lp](const TokenEvent& e) {
      if (e.token >= 0) lp.emplace_back(e.token, e.logprob);
    };
    EngineConfig ec;
    ec.spec = {d, 4, SpecAccept::residual, false};
    Engine eng(*models().target->model, ec);
    eng.add(std::move(r));
    while (eng.has_work()) eng.step();
    return lp;
  };
  const auto plain = logprobs(nullptr), spec = logprobs(draft.get());
  ASSERT_EQ(spec.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(spec[i].first, plain[i].first);
    EXPECT_NEAR(spec[i].second, plain[i].second, 1e-4) << i;
  }
}

TEST_F(KILN_SPEC_SUITE, ADraftWithAnotherTokenizerIsRefusedNamingTheToken) {
  auto other = load("aidreams260K");
  try {
    make_draft_model(*other, *models().target);
    FAIL() << "accepted a draft with another tokenizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_ngram_draft(3, 2), Error);
  EngineConfig ec;
  ec.spec.num_draft_tokens = 17;
  auto ngram = make_ngram_draft();
  ec.spec.draft = ngram.get();
  EXPECT_THROW(Engine(*models().target->model, ec), Error);
}

TEST_F(KILN_SPEC_SUITE, PromptLookupProposesWhatFollowedTheLatestMatch) {
  auto d = make_ngram_draft(2, 3);
  Request r;
  r.prompt = {1, 5, 6, 7, 8, 9, 5, 6, 7, 4, 5, 6, 7};
  Sequence s(1, std::move(r));
  Draft out;
  const DraftAsk ask{&s, 3, false, &out};
  d->propose({&ask, 1});
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{4, 5, 6}));  // "5 6 7" last seen before "4"
  s.tokens = {1, 2, 3, 4};
  d->propose({&ask, 1});
  EXPECT_TRUE(out.tokens.empty());
}

// The token after prompt + the target's most likely first token, at temperature 1: its empirical
// distribution over many seeds (each request drafts it: max_tokens 3 leaves room for one draft)
// against the target's softmax, by a chi-square test at p = 0.001.
namespace {

void expect_target_distribution(DraftSource* draft, SpecAccept accept, double min_acceptance,
                                const char* text = "Once upon a time") {
  const std::vector<int32_t> prompt = encode(text);
  model::Model& m = *models().target->model;
  auto logits_after = [&](const std::vector<int32_t>& t) {
    auto kv = model::KvCache::allocate(m.backend(), m.config(), 8, 16);
    ModelRunner r(m, kv);
    const std::vector<int32_t> blocks{0, 1, 2, 3, 4, 5, 6, 7};
    SeqChunk c{t, 0, static_cast<int>(t.size()), blocks, 1, nullptr};
    Tensor l = r.logits({&c, 1});
    return std::vector<float>(l.ptr<float>(), l.ptr<float>() + l.numel());
  };
  const std::vector<float> l0 = logits_after(prompt);
  const int32_t first = argmax(l0);
  std::vector<int32_t> ctx = prompt;
  ctx.push_back(first);
  const std::vector<float> l1 = logits_after(ctx);
  std::vector<double> p(l1.size());
  double mx = *std::max_element(l1.begin(), l1.end()), sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(l1[i] - mx);
  for (double& x : p) x /= sum;

  constexpr int kSeeds = 4000;
  std::map<int32_t, int> counts;
  int n_cond = 0, drafted = 0, accepted = 0;
  for (int base = 0; base < kSeeds; base += 64) {
    std::vector<Request> reqs;
    for (int s = base; s < base + 64; ++s) {
      Request r;
      r.prompt = prompt;
      r.max_tokens = 3;
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 1000 + s;
      reqs.push_back(std::move(r));
    }
    for (const Output& r : run(std::move(reqs), draft, 1, false, accept)) {
      if (r.tokens[0] != first) continue;
      ++n_cond;
      ++counts[r.tokens[1]];
      drafted += r.draft_n;
      accepted += r.draft_n_accepted;
    }
  }
  ASSERT_GT(n_cond, 500);
  ASSERT_GT(drafted, n_cond / 2);
  EXPECT_GE(static_cast<double>(accepted) / drafted, min_acceptance);
  // Bins with expected count >= 5; the rest pooled into one.
  double chi2 = 0, rest_e = 0, rest_o = 0;
  int df = -1;
  for (size_t t = 0; t < p.size(); ++t) {
    const double e = p[t] * n_cond;
    const int o = counts.count(static_cast<int32_t>(t)) ? counts[static_cast<int32_t>(t)] : 0;
    if (e >= 5) {
      chi2 += (o - e) * (o - e) / e;
      ++df;
    } else {
      rest_e += e;
      rest_o += o;
    }
  }
  if (rest_e > 0) {
    chi2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
    ++df;
  }
  ASSERT_GE(df, 3);
  // Wilson-Hilferty: the 0.999 quantile of chi-square with df degrees of freedom.
  const double z = 3.0902, k = df;
  const double limit = k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
  EXPECT_LT(chi2, limit) << "df " << df << ", " << n_cond << " samples";
}

}  // namespace

TEST_F(KILN_SPEC_SUITE, SampledDraftModelKeepsTheTargetDistributionResidualRule) {
  auto draft = make_draft_model(*models().xs, *models().target);
  expect_target_distribution(draft.get(), SpecAccept::residual, 0.2);
}

TEST_F(KILN_SPEC_SUITE, SampledDraftModelKeepsTheTargetDistributionExactRule) {
  auto draft = make_draft_model(*models().xs, *models().target);
  expect_target_distribution(draft.get(), SpecAccept::exact, 0.05);
}

TEST_F(KILN_SPEC_SUITE, PromptLookupKeepsTheTargetDistribution) {
  // A point-mass draft (what followed the first token the first time) under the residual rule.
  auto draft = make_ngram_draft(1, 1);
  expect_target_distribution(draft.get(), SpecAccept::residual, 0.0, "Once upon a time, there was a cat. Once upon a time");
}
