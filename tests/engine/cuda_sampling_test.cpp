// The device sampler (Backend::sample_rows on CUDA) against the host Sampler's semantics:
// greedy is exactly the host argmax (after bias and penalties, which must give bit-identical
// logits); top-k / min-p / top-p keep exactly the host's token set (ties included); draws follow
// the host's probabilities (chi-square over many draws, and the exact inverse CDF of each draw);
// in the engine, the same seed gives the same tokens and the distribution of a real model's next
// token matches the host path's. Fresh random logits every run (the seed is printed).
// Reports SKIPPED where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "kiln/base/error.h"
#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/engine/sampler.h"

using namespace kiln;
using engine::SamplingParams;

namespace {

std::string shared_dir() {
  const char* e = std::getenv("KILN_SHARED_DIR");
  return e ? e : KILN_SHARED_DIR;
}

uint64_t fresh_seed() {
  static const uint64_t s = std::random_device{}() * 0x100000001ull + std::random_device{}();
  return s;
}

std::vector<float> random_logits(std::mt19937_64& g, int64_t vocab, float scale, float quantum) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (auto& x : v) {
    x = d(g);
    if (quantum > 0) x = std::round(x / quantum) * quantum;  // many exact ties
  }
  return v;
}

// The host Sampler's kept set after its filters (backend::kept_candidates, which Sampler::sample
// draws from), in its rank order, with probabilities renormalized over the kept tokens; checked
// against the real Sampler's draws below.
struct Kept {
  std::vector<int32_t> ids;
  std::vector<double> prob;
};
Kept host_kept(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> c;
  std::vector<double> prob;
  backend::kept_candidates(logits, engine::device_sample_params(p, 0.0), c, prob);
  Kept k;
  double mass = 0;
  for (double q : prob) mass += q;
  for (size_t i = 0; i < c.size(); ++i) k.ids.push_back(c[i].second), k.prob.push_back(prob[i] / mass);
  return k;
}

// The token the device's draw u picks: the kept tokens in id order, the first whose cumulative
// probability exceeds u (the device does this in 2^-40 fixed point).
int32_t id_order_pick(const Kept& k, double u) {
  std::vector<std::pair<int32_t, double>> v;
  for (size_t i = 0; i < k.ids.size(); ++i) v.emplace_back(k.ids[i], k.prob[i]);
  std::sort(v.begin(), v.end());
  double acc = 0;
  for (auto& [id, p] : v) {
    acc += p;
    if (acc > u) return id;
  }
  return v.back().first;
}

// Pearson chi-square of counts against probabilities (bins with expectation < 5 pooled); returns
// (statistic, degrees of freedom).
std::pair<double, int> chi_square(const std::map<int32_t, int>& counts, const Kept& k, int n) {
  double stat = 0, pool_e = 0, pool_o = 0;
  int bins = 0;
  for (size_t i = 0; i < k.ids.size(); ++i) {
    const double e = k.prob[i] * n;
    auto it = counts.find(k.ids[i]);
    const double o = it == counts.end() ? 0 : it->second;
    if (e < 5) {
      pool_e += e, pool_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++bins;
  }
  if (pool_e >= 5) stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, ++bins;
  return {stat, std::max(1, bins - 1)};
}
// The bound a chi-square statistic must stay under: mean + 6 standard deviations (+10 for few
// bins); a correct sampler exceeds it with probability far below 1e-6.
double chi_bound(int df) { return df + 6 * std::sqrt(2.0 * df) + 10; }

struct DeviceRun {
  std::vector<int32_t> ids;
  std::vector<float> adjusted;  // the logits after sample_rows adjusted them
};
DeviceRun device_sample(backend::Backend& be, const std::vector<float>& logits, int64_t rows, int64_t vocab,
                        const std::vector<backend::SampleParams>& params,
                        const std::vector<backend::LogitAdjust>& adjust = {}, const backend::TokenMasks& masks = {}) {
  Tensor h = Tensor::host(DType::f32, {rows, vocab});
  std::copy(logits.begin(), logits.end(), h.ptr<float>());
  Tensor d = be.upload(h);
  Tensor ids = be.alloc(DType::i32, {rows});
  be.sample_rows(d, params, adjust, ids, masks);
  Tensor hi = be.to_host(ids), hl = be.to_host(d);
  DeviceRun r;
  r.ids.assign(hi.ptr<int32_t>(), hi.ptr<int32_t>() + rows);
  r.adjusted.assign(hl.ptr<float>(), hl.ptr<float>() + rows * vocab);
  return r;
}

#define REQUIRE_GPU() \
  if (!backend::cuda_device_available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)"

TEST(CudaSampling, GreedyAndPenaltiesMatchTheHostExactly) {
  REQUIRE_GPU();
  auto be = backend::make_cuda_backend(0);
  std::mt19937_64 g(fresh_seed());
  std::printf("seed %llu\n", static_cast<unsigned long long>(fresh_seed()));
  for (int64_t vocab : {1, 7, 1000, 32001, 151936}) {
    const int64_t rows = vocab > 100000 ? 16 : 48;
    std::vector<float> logits;
    for (int64_t r = 0; r < rows; ++r) {
      auto row = random_logits(g, vocab, 4.0f, r % 3 == 0 ? 0.5f : 0.0f);  // every third row full of ties
      logits.insert(logits.end(), row.begin(), row.end());
    }
    // Per row: random bias / repetition / presence / frequency, over a random context.
    std::vector<backend::SampleParams> params;
    std::vector<backend::LogitAdjust> adjust;
    std::vector<float> expect = logits;
    std::vector<int32_t> expect_ids;
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
    for (int64_t r = 0; r < rows; ++r) {
      SamplingParams p;
      p.repetition_penalty = r % 2 ? 1.3f : 1.0f;
      p.presence_penalty = r % 4 == 1 ? 0.7f : 0.0f;
      p.frequency_penalty = r % 4 == 3 ? 0.35f : 0.0f;
      for (int i = 0; i < 3; ++i) p.logit_bias[tok(g)] = (i - 1) * 5.5f;
      std::vector<int32_t> context;
      for (int i = 0; i < 20; ++i) context.push_back(tok(g));
      std::span<const int32_t> generated(context.data() + 12, 8);
      std::span<float> row(expect.data() + r * vocab, static_cast<size_t>(vocab));
      engine::apply_penalties(p, row, context, generated);
      expect_ids.push_back(engine::argmax(row));
      params.push_back(engine::device_sample_params(p, 0.0));
      std::map<int32_t, backend::LogitAdjust> touched;
      for (auto [id, b] : p.logit_bias) touched[id].bias = b;
      if (p.repetition_penalty != 1.0f)
        for (int32_t id : context) touched[id].in_context = 1;
      for (int32_t id : generated) ++touched[id].n_generated;
      for (auto& [id, a] : touched) {
        a.row = static_cast<int32_t>(r), a.token = id;
        adjust.push_back(a);
      }
    }
    DeviceRun d = device_sample(*be, logits, rows, vocab, params, adjust);
    int64_t logit_mismatch = 0;
    for (size_t i = 0; i < expect.size(); ++i) logit_mismatch += expect[i] != d.adjusted[i];
    EXPECT_EQ(logit_mismatch, 0) << "vocab " << vocab << ": adjusted logits differ from the host's apply_penalties";
    EXPECT_EQ(d.ids, expect_ids) << "vocab " << vocab << ": greedy differs from the host argmax";
  }
}

struct FilterCase {
  const char* name;
  float temperature, top_p, min_p;
  int top_k;
  float quantum;  // > 0: logits on a grid (ties at every cut)
};

TEST(CudaSampling, FiltersAndDistributionMatchTheHostSampler) {
  REQUIRE_GPU();
  auto be = backend::make_cuda_backend(0);
  std::mt19937_64 g(fresh_seed() + 1);
  const FilterCase cases[] = {
      {"temperature only", 1.0f, 1.0f, 0.0f, 0, 0.0f},      {"top-k 20", 0.7f, 1.0f, 0.0f, 20, 0.0f},
      {"top-p 0.8", 1.0f, 0.8f, 0.0f, 0, 0.0f},             {"min-p 0.05", 1.3f, 1.0f, 0.05f, 0, 0.0f},
      {"all three", 0.9f, 0.9f, 0.02f, 50, 0.0f},           {"top-k 7, ties", 1.0f, 1.0f, 0.0f, 7, 0.5f},
      {"top-p 0.6, ties", 1.5f, 0.6f, 0.0f, 0, 0.25f},      {"top-k 1", 1.0f, 1.0f, 0.0f, 1, 0.0f},
      {"top-p 0.001", 1.0f, 0.001f, 0.0f, 0, 0.0f},          {"hot, min-p 0.3, ties", 2.0f, 1.0f, 0.3f, 0, 0.5f},
  };
  const int64_t vocab = 1000, n = 16384;
  for (const FilterCase& fc : cases) {
    SamplingParams p;
    p.temperature = fc.temperature, p.top_p = fc.top_p, p.min_p = fc.min_p, p.top_k = fc.top_k;
    const std::vector<float> row = random_logits(g, vocab, 2.5f, fc.quantum);
    const Kept k = host_kept(row, p);
    std::set<int32_t> allowed(k.ids.begin(), k.ids.end());

    // The real host Sampler (the mirror's check): its draws stay in the set, distributed as computed.
    std::map<int32_t, int> host_counts;
    engine::Sampler s([&] { SamplingParams q = p; q.seed = g(); return q; }());
    for (int i = 0; i < n; ++i) {
      std::vector<float> l = row;
      ++host_counts[s.sample(l, {}, {})];
    }
    for (auto& [id, c] : host_counts) ASSERT_TRUE(allowed.count(id)) << fc.name << ": host drew " << id << " outside the mirror's set";
    auto [hs, hdf] = chi_square(host_counts, k, static_cast<int>(n));
    EXPECT_LT(hs, chi_bound(hdf)) << fc.name << ": host sampler vs its own probabilities";

    // The device: n rows of the same logits, each with its own draw.
    std::vector<float> logits;
    logits.reserve(static_cast<size_t>(n * vocab));
    std::vector<backend::SampleParams> params;
    std::uniform_real_distribution<double> U(0.0, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      logits.insert(logits.end(), row.begin(), row.end());
      params.push_back(engine::device_sample_params(p, U(g)));
    }
    DeviceRun d = device_sample(*be, logits, n, vocab, params);
    std::map<int32_t, int> dev_counts;
    int64_t outside = 0, same_pick = 0;
    for (int64_t i = 0; i < n; ++i) {
      ++dev_counts[d.ids[i]];
      outside += !allowed.count(d.ids[i]);
      same_pick += d.ids[i] == id_order_pick(k, params[i].uniform);
    }
    EXPECT_EQ(outside, 0) << fc.name << ": the device drew tokens its filters should have removed";
    auto [ds, ddf] = chi_square(dev_counts, k, static_cast<int>(n));
    EXPECT_LT(ds, chi_bound(ddf)) << fc.name << ": device draws vs the host probabilities";
    // Each draw is the inverse CDF of its uniform: only draws within ~1e-9 of a boundary may differ.
    EXPECT_GE(same_pick, n - 2) << fc.name << ": device picks differ from the exact inverse CDF";
    std::printf("%-22s kept %4zu tokens; chi2 host %.1f device %.1f (df %d, bound %.1f); exact picks %lld/%lld\n",
                fc.name, k.ids.size(), hs, ds, ddf, chi_bound(ddf), static_cast<long long>(same_pick),
                static_cast<long long>(n));
  }
}

// Grammar masks (TokenMasks) on the device: the masked logits equal the host's (-inf exactly where
// a bit is clear, on the listed rows only), greedy rows pick the host's masked argmax, sampled rows
// the exact inverse CDF of the host's kept set over the masked row; masks of 1 token, 1%, half and
// every token, at the vocabularies of stories260K, llama-2 and qwen2.5 (a word count past the vocab too).
TEST(CudaSampling, TokenMasksMatchTheHost) {
  REQUIRE_GPU();
  auto be = backend::make_cuda_backend(0);
  std::mt19937_64 g(fresh_seed() + 3);
  for (int64_t vocab : {512, 32000, 151936}) {
    const int64_t rows = 24;
    std::vector<float> logits;
    for (int64_t r = 0; r < rows; ++r) {
      auto row = random_logits(g, vocab, 3.0f, r % 4 == 0 ? 0.5f : 0.0f);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    backend::TokenMasks m;
    m.n_words = (vocab + 31) / 32 + (vocab > 1000 ? 2 : 0);
    std::vector<backend::SampleParams> params;
    std::vector<float> expect = logits;
    std::uniform_real_distribution<double> U(0.0, 1.0);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
    for (int64_t r = 0; r < rows; ++r) {
      SamplingParams p;
      if (r % 3) p.temperature = 1.0f, p.top_k = r % 3 == 2 ? 40 : 0, p.top_p = r % 5 == 1 ? 0.9f : 1.0f;
      params.push_back(engine::device_sample_params(p, p.temperature > 0 ? U(g) : 0.0));
      if (r % 6 == 5) continue;  // an unmasked row
      const double density = std::array<double, 4>{0.0, 0.01, 0.5, 1.0}[r % 4];
      std::vector<uint32_t> w(static_cast<size_t>(m.n_words), 0);
      std::bernoulli_distribution keep(density);
      for (int32_t t = 0; t < vocab; ++t)
        if (keep(g)) w[t >> 5] |= 1u << (t & 31);
      const int32_t one = tok(g);
      w[one >> 5] |= 1u << (one & 31);  // at least one token
      for (int32_t t = 0; t < vocab; ++t)
        if (!((w[t >> 5] >> (t & 31)) & 1u)) expect[r * vocab + t] = -INFINITY;
      m.rows.push_back(static_cast<int32_t>(r));
      m.words.insert(m.words.end(), w.begin(), w.end());
    }
    DeviceRun d = device_sample(*be, logits, rows, vocab, params, {}, m);
    int64_t logit_mismatch = 0;
    for (size_t i = 0; i < expect.size(); ++i) logit_mismatch += expect[i] != d.adjusted[i];
    EXPECT_EQ(logit_mismatch, 0) << "vocab " << vocab << ": masked logits differ from the host's";
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> row(expect.begin() + r * vocab, expect.begin() + (r + 1) * vocab);
      SamplingParams p;
      p.temperature = params[r].temperature, p.top_k = params[r].top_k, p.top_p = params[r].top_p;
      const int32_t want = p.temperature > 0 ? id_order_pick(host_kept(row, p), params[r].uniform) : engine::argmax(row);
      EXPECT_EQ(d.ids[r], want) << "vocab " << vocab << " row " << r;
      EXPECT_TRUE(std::isfinite(row[d.ids[r]])) << "vocab " << vocab << " row " << r << ": a masked token was drawn";
    }
  }
  // A mask for a row that is not there, or too few words: an error, not a kernel out of bounds.
  std::vector<float> l(64, 0.0f);
  backend::TokenMasks bad;
  bad.n_words = 2, bad.rows = {1}, bad.words = {~0u, ~0u};
  EXPECT_THROW(device_sample(*be, l, 1, 64, {backend::SampleParams{}}, {}, bad), Error);
  bad.rows = {0}, bad.n_words = 1, bad.words = {~0u};
  EXPECT_THROW(device_sample(*be, l, 1, 64, {backend::SampleParams{}}, {}, bad), Error);
}

TEST(CudaSampling, NonFiniteLogitsAreNeverDrawn) {
  REQUIRE_GPU();
  auto be = backend::make_cuda_backend(0);
  std::vector<float> row(300, -INFINITY);
  row[17] = 1.0f, row[200] = 1.5f, row[299] = NAN;
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<backend::SampleParams> params;
  for (int i = 0; i < 64; ++i) params.push_back(engine::device_sample_params(p, (i + 0.5) / 64));
  std::vector<float> logits;
  for (int i = 0; i < 64; ++i) logits.insert(logits.end(), row.begin(), row.end());
  DeviceRun d = device_sample(*be, logits, 64, 300, params);
  for (int32_t id : d.ids) EXPECT_TRUE(id == 17 || id == 200) << id;
  EXPECT_NE(std::count(d.ids.begin(), d.ids.end(), 17), 0);
  EXPECT_NE(std::count(d.ids.begin(), d.ids.end(), 200), 0);
}

// Not a check: the time of one sample_rows call at a 152k vocab (qwen2.5's), printed for the report.
TEST(CudaSampling, TimingAtALargeVocab) {
  REQUIRE_GPU();
  auto be = backend::make_cuda_backend(0);
  std::mt19937_64 g(fresh_seed() + 2);
  const int64_t vocab = 151936;
  for (int64_t rows : {1, 64, 128}) {
    std::vector<float> logits;
    for (int64_t r = 0; r < rows; ++r) {
      auto row = random_logits(g, vocab, 3.0f, 0.0f);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    Tensor h = Tensor::host(DType::f32, {rows, vocab});
    std::copy(logits.begin(), logits.end(), h.ptr<float>());
    Tensor d = be->upload(h), ids = be->alloc(DType::i32, {rows});
    for (int variant = 0; variant < 3; ++variant) {
      SamplingParams p;
      p.temperature = variant == 0 ? 0.0f : 0.8f;
      if (variant == 2) p.top_p = 0.9f, p.top_k = 50, p.min_p = 0.01f;
      std::vector<backend::SampleParams> params(static_cast<size_t>(rows), engine::device_sample_params(p, 0.5));
      be->sample_rows(d, params, {}, ids);  // warm-up
      be->synchronize();
      const int reps = 20;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) {  // as in the engine: parameters uploaded inside a step
        backend::StepScope step(*be);
        be->sample_rows(d, params, {}, ids);
      }
      be->synchronize();
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
      std::printf("sample_rows timing: %3lld rows x %lld vocab, %-28s %8.1f us per call\n", static_cast<long long>(rows),
                  static_cast<long long>(vocab),
                  variant == 0 ? "greedy" : variant == 1 ? "temperature 0.8" : "t 0.8, top-k/p, min-p", us);
    }
  }
}

// ---- in the engine, on a real model

struct EngineRun {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, int> logprob_events;
};

EngineRun run_engine(engine::LoadedModel& m, bool device_sampling, const std::vector<engine::Request>& reqs, int batch) {
  engine::EngineConfig ec;
  ec.scheduler.max_seqs = batch;
  ec.n_blocks = batch * 8 + 8;
  ec.device_sampling = device_sampling;
  engine::Engine eng(*m.model, ec);
  EngineRun r;
  for (engine::Request q : reqs) {
    q.on_event = [&r](const engine::TokenEvent& e) {
      if (e.token < 0) return;
      r.tokens[e.request_id].push_back(e.token);
      if (!e.top.empty()) ++r.logprob_events[e.request_id];
    };
    eng.add(std::move(q));
  }
  while (eng.has_work()) eng.step();
  return r;
}

engine::Request request(std::vector<int32_t> prompt, int max_tokens, SamplingParams p) {
  engine::Request q;
  q.prompt = std::move(prompt);
  q.max_tokens = max_tokens;
  q.sampling = std::move(p);
  return q;
}

TEST(CudaSampling, EngineSameSeedSameTokensAndLogprobsFallBack) {
  REQUIRE_GPU();
  engine::LoadOptions opt;
  opt.device = "cuda";
  auto m = engine::load_model(shared_dir() + "/models/stories260K", opt);
  std::vector<engine::Request> reqs;
  for (int s = 0; s < 6; ++s) {
    SamplingParams p;
    p.temperature = 0.9f, p.top_p = 0.95f, p.top_k = 40, p.min_p = 0.01f;
    p.repetition_penalty = s % 2 ? 1.2f : 1.0f;
    p.presence_penalty = s % 3 == 1 ? 0.5f : 0.0f;
    p.frequency_penalty = s % 3 == 2 ? 0.3f : 0.0f;
    p.logit_bias[13] = -100.0f;  // never drawn
    p.seed = 1000 + s;
    reqs.push_back(request({1, static_cast<int32_t>(30 + s), 50}, 40, p));
  }
  EngineRun a = run_engine(*m, true, reqs, 4), b = run_engine(*m, true, reqs, 4);
  ASSERT_EQ(a.tokens.size(), 6u);
  EXPECT_EQ(a.tokens, b.tokens) << "same seeds, same backend: the tokens must repeat";
  for (auto& [id, t] : a.tokens) EXPECT_EQ(std::count(t.begin(), t.end(), 13), 0) << "a -100 logit bias was drawn";
  for (auto& r : reqs) r.sampling.seed = *r.sampling.seed + 77;
  EngineRun c = run_engine(*m, true, reqs, 4);
  EXPECT_NE(a.tokens, c.tokens) << "other seeds should give other tokens";

  // A request with logprobs in the batch: that step samples on the host; tokens stay valid and
  // the logprobs arrive for every token.
  reqs[2].logprobs = 3;
  EngineRun d = run_engine(*m, true, reqs, 4);
  const int64_t lp_id = std::next(d.tokens.begin(), 2)->first;
  EXPECT_EQ(d.logprob_events[lp_id], static_cast<int>(d.tokens[lp_id].size()));
  EXPECT_EQ(d.tokens.size(), 6u);
}

TEST(CudaSampling, EngineNextTokenDistributionMatchesTheHostPath) {
  REQUIRE_GPU();
  engine::LoadOptions opt;
  opt.device = "cuda";
  auto m = engine::load_model(shared_dir() + "/models/stories260K", opt);
  // 1536 requests of the same prompt, one token each, different seeds: the first token's
  // histogram on the device path against the host path (two-sample chi-square).
  const int n = 1536;
  const uint64_t base = fresh_seed();
  auto make = [&](uint64_t offset) {
    std::vector<engine::Request> reqs;
    for (int i = 0; i < n; ++i) {
      SamplingParams p;
      p.temperature = 1.2f, p.top_p = 0.97f, p.top_k = 100;
      p.seed = base + offset + static_cast<uint64_t>(i);
      reqs.push_back(request({1, 403, 261}, 1, p));
    }
    return reqs;
  };
  EngineRun dev = run_engine(*m, true, make(0), 64), host = run_engine(*m, false, make(1u << 30), 64);
  std::map<int32_t, std::pair<int, int>> h;
  for (auto& [id, t] : dev.tokens) ++h[t.at(0)].first;
  for (auto& [id, t] : host.tokens) ++h[t.at(0)].second;
  double stat = 0;
  int bins = 0, pool_a = 0, pool_b = 0;
  for (auto& [tok, ab] : h) {
    if (ab.first + ab.second < 10) {
      pool_a += ab.first, pool_b += ab.second;
      continue;
    }
    stat += std::pow(ab.first - ab.second, 2) / (ab.first + ab.second);
    ++bins;
  }
  if (pool_a + pool_b >= 10) stat += std::pow(pool_a - pool_b, 2) / (pool_a + pool_b), ++bins;
  const int df = std::max(1, bins - 1);
  std::printf("first-token histogram, device vs host path: %zu distinct tokens, chi2 %.1f (df %d, bound %.1f)\n",
              h.size(), stat, df, chi_bound(df));
  EXPECT_GT(bins, 5) << "the distribution should spread over several tokens";
  EXPECT_LT(stat, chi_bound(df));
}

}  // namespace
