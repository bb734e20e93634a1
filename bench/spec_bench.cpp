// spec_bench: speculative decoding through the engine, as ratios from one run.
//   generation: greedy decode tok/s of B prompts without drafts, then with the draft source at each
//     draft length (fixed) and adaptive (SpecPolicy), with the acceptance rate and tokens per verify;
//   --oracle A,..: a replay draft that proposes the run's own next tokens, each right with
//     probability A (so acceptance is set, from ~0 to 1; see replay below); with --draft it also runs the draft model's
//     proposals (discarded) so the ratio includes a real draft's cost;
//   --verify-cost B,..: one target forward of B sequences x (1 + n) tokens (a uniform verify, graphed
//     like decode) over one decode step of B sequences, n = 1..8, at a 512-token context.
// Usage: spec_bench --model DIR [--device cpu|cuda] [--draft DIR | --ngram] [--batch 1,8] [--n 1,2,3,4]
//                   [--max-tokens 128] [--oracle 0,0.5,1] [--verify-cost 1,8,64] [--repetitive]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>

#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/engine/sequence.h"
#include "kiln/engine/speculative.h"

using namespace kiln;
using namespace kiln::engine;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<int> int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) v.push_back(std::atoi(x.c_str()));
  return v;
}
std::vector<double> real_list(const std::string& s) {
  std::vector<double> v;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) v.push_back(std::atof(x.c_str()));
  return v;
}

// Prompts of ~48 tokens: stories-like text through the tokenizer, or (--repetitive) a sentence
// said three times, where prompt lookup has matches.
std::vector<std::vector<int32_t>> prompts(const LoadedModel& m, int n, bool repetitive) {
  const char* text[] = {"Once upon a time, there was a little girl named Lily. She loved to play outside",
                        "Tom had a big red ball. One day he went to the park with his mom and",
                        "The sun was hot and the birds were singing. A small cat sat under a tree",
                        "Sam wanted to bake a cake for his friend. He got flour, eggs and milk and"};
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::string t = text[i % 4];
    if (repetitive) t = t + ". " + t + ". " + t + ".";
    std::vector<int32_t> ids = m.tokenizer->encode(t, true);
    ids.push_back(static_cast<int32_t>(10 + i));  // distinct prompts
    out.push_back(ids);
  }
  return out;
}

struct Result {
  double tok_s = 0;
  int64_t drafted = 0, accepted = 0, verifies = 0;
  std::vector<std::vector<int32_t>> outputs;  // prompt + generated, per prompt
};

// Greedy decode of every prompt at once; tok/s over the steps after every first token.
Result generate(LoadedModel& m, const std::vector<std::vector<int32_t>>& ps, int max_tokens, DraftSource* d, int n,
                bool adaptive) {
  EngineConfig ec;
  ec.scheduler.max_seqs = static_cast<int>(ps.size());
  ec.n_blocks = static_cast<int>(ps.size()) * ((static_cast<int>(ps[0].size()) + max_tokens + 32) / 16 + 2);
  ec.spec = {d, n, SpecAccept::residual, adaptive};
  Engine eng(*m.model, ec);
  Result r;
  r.outputs = ps;
  int started = 0;
  int64_t timed = 0;
  bool timing = false;
  for (size_t i = 0; i < ps.size(); ++i) {
    Request q;
    q.prompt = ps[i];
    q.max_tokens = max_tokens;
    q.on_event = [&, i](const TokenEvent& e) {
      if (e.token < 0) return;
      if (r.outputs[i].size() == ps[i].size()) ++started;
      r.outputs[i].push_back(e.token);
      if (timing) ++timed;
    };
    eng.add(std::move(q));
  }
  while (eng.has_work() && started < static_cast<int>(ps.size())) eng.step();
  const EngineStats s0 = eng.stats();
  timing = true;
  const auto t0 = Clock::now();
  while (eng.has_work()) eng.step();
  m.model->backend().synchronize();
  r.tok_s = timed / std::chrono::duration<double>(Clock::now() - t0).count();
  r.drafted = eng.stats().draft_tokens - s0.draft_tokens;
  r.accepted = eng.stats().accepted_tokens - s0.accepted_tokens;
  r.verifies = eng.stats().verifies - s0.verifies;
  return r;
}

// Proposes the plain run's continuation, each token right with probability `a` (else a wrong id);
// `inner` (a draft model) also proposes, for its cost only.
class OracleDraft final : public DraftSource {
 public:
  OracleDraft(const std::vector<std::vector<int32_t>>& truth, double a, int vocab, DraftSource* inner)
      : truth_(truth), a_(a), vocab_(vocab), inner_(inner) {}
  std::string name() const override { return "oracle"; }
  void reserve(int n_blocks, int block_size) override {
    if (inner_) inner_->reserve(n_blocks, block_size);
  }
  void prefill(std::span<const Sequence* const> seqs) override {
    if (inner_) inner_->prefill(seqs);
  }
  void forget(int64_t id) override {
    if (inner_) inner_->forget(id);
  }
  size_t kv_bytes(int n) const override { return inner_ ? inner_->kv_bytes(n) : 0; }
  void propose(std::span<const DraftAsk> asks) override {
    if (inner_) inner_->propose(asks);
    for (const DraftAsk& k : asks) {
      k.out->tokens.clear();
      k.out->probs.clear();
      const std::vector<int32_t>& t = k.seq->tokens;
      for (const auto& full : truth_) {
        if (full.size() < t.size() || !std::equal(t.begin(), t.end(), full.begin())) continue;
        for (size_t j = t.size(); j < full.size() && static_cast<int>(k.out->tokens.size()) < k.n; ++j)
          k.out->tokens.push_back(coin_(rng_) < a_ ? full[j] : (full[j] + 1) % vocab_);
        break;
      }
    }
  }

 private:
  const std::vector<std::vector<int32_t>>& truth_;
  double a_;
  int vocab_;
  DraftSource* inner_;
  std::mt19937_64 rng_{7};
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
};

// Seconds per uniform step of b sequences x q tokens at positions [ctx, ctx + q) (median of 15).
double step_seconds(LoadedModel& m, int b, int q, int ctx) {
  const int bs = 16, per = (ctx + q + bs - 1) / bs;
  auto kv = model::KvCache::allocate(m.model->backend(), m.config, b * per, bs);
  ModelRunner runner(*m.model, kv);
  std::vector<std::vector<int32_t>> tokens(b), blocks(b);
  for (int i = 0; i < b; ++i) {
    for (int p = 0; p < ctx + q; ++p) tokens[i].push_back(static_cast<int32_t>(3 + (p * 7 + i) % 400));
    for (int k = 0; k < per; ++k) blocks[i].push_back(i * per + k);
  }
  // Greedy, as the engine runs them: the device's argmax of every row comes back.
  Sampler greedy({});
  const SampleSpec spec{&greedy, tokens[0], {}, {}, false};
  std::vector<SeqChunk> chunks(b);
  for (int i = 0; i < b; ++i) chunks[i] = {tokens[i], ctx, q, blocks[i], q, &spec, q > 1};
  std::vector<double> ts;
  for (int r = 0; r < 18; ++r) {
    const auto t0 = Clock::now();
    runner.run(chunks);
    m.model->backend().synchronize();
    if (r >= 3) ts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, draft_dir, device = "cpu", batches = "1", ns = "1,2,3,4", oracle, vcost;
  bool ngram = false, repetitive = false;
  int max_tokens = 128;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (k == "--model") dir = val();
    else if (k == "--draft") draft_dir = val();
    else if (k == "--device") device = val();
    else if (k == "--batch") batches = val();
    else if (k == "--n") ns = val();
    else if (k == "--max-tokens") max_tokens = std::atoi(val().c_str());
    else if (k == "--oracle") oracle = val();
    else if (k == "--verify-cost") vcost = val();
    else if (k == "--ngram") ngram = true;
    else if (k == "--repetitive") repetitive = true;
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: spec_bench --model DIR [--device cpu|cuda] [--draft DIR | --ngram] [--batch 1,8] "
                         "[--n 1,2,3,4] [--max-tokens N] [--oracle A,..] [--verify-cost B,..] [--repetitive]\n");
    return 2;
  }
  try {
    auto m = load_model(dir, {.device = device});
    std::unique_ptr<LoadedModel> dm;
    std::unique_ptr<DraftSource> src;
    if (!draft_dir.empty()) {
      dm = load_model(draft_dir, {.device = device});
      src = make_draft_model(*dm, *m);
    } else if (ngram) {
      src = make_ngram_draft();
    }
    std::printf("target %s, draft %s, device %s, %d tokens\n", dir.c_str(), src ? src->name().c_str() : "-",
                device.c_str(), max_tokens);

    if (!vcost.empty()) {
      std::printf("\nverify cost: one step of B x (1 + n) tokens / one decode step of B (context 512)\n%-6s", "B");
      for (int n = 1; n <= 8; ++n) std::printf("  n=%d  ", n);
      std::printf("  decode ms\n");
      for (int b : int_list(vcost)) {
        const double t1 = step_seconds(*m, b, 1, 512);
        std::printf("%-6d", b);
        for (int n = 1; n <= 8; ++n) std::printf("  %5.3f", step_seconds(*m, b, 1 + n, 512) / t1);
        std::printf("   %7.3f\n", t1 * 1e3);
      }
    }

    for (int b : int_list(batches)) {
      const auto ps = prompts(*m, b, repetitive);
      const Result plain = generate(*m, ps, max_tokens, nullptr, 0, false);
      std::printf("\nbatch %d: plain %.1f tok/s\n", b, plain.tok_s);
      auto report = [&](const char* what, int n, const Result& r) {
        std::printf("  %-18s n=%d  %8.1f tok/s  x%.3f  acceptance %.3f  tokens/verify %.2f%s\n", what, n, r.tok_s,
                    r.tok_s / plain.tok_s, r.drafted ? static_cast<double>(r.accepted) / r.drafted : 0.0,
                    r.verifies ? static_cast<double>(r.accepted + r.verifies) / r.verifies : 1.0,
                    r.outputs == plain.outputs ? "" : "  OUTPUT DIFFERS");
      };
      if (!oracle.empty()) {
        // On a GPU the verify's batched rows may break a near-tie differently from plain decoding
        // (bf16), so the drafted run can leave the plain run's tokens; the replay then re-learns the
        // run's own tokens until a run follows them (a fixed point: the same draws, the same shapes).
        auto replay = [&](double a, int n, bool adaptive) {
          std::vector<std::vector<int32_t>> truth = plain.outputs;
          Result r;
          for (int iter = 0; iter < 8; ++iter) {
            OracleDraft od(truth, a, m->config.vocab_size, src.get());
            r = generate(*m, ps, max_tokens, &od, n, adaptive);
            if (r.outputs == truth) break;
            truth = r.outputs;
          }
          return r;
        };
        for (double a : real_list(oracle)) {
          char what[32];
          std::snprintf(what, sizeof what, "replay a=%.2f", a);
          for (int n : int_list(ns)) report(what, n, replay(a, n, false));
          std::snprintf(what, sizeof what, "replay a=%.2f adapt", a);
          report(what, int_list(ns).back(), replay(a, int_list(ns).back(), true));
        }
        continue;
      }
      if (!src) continue;
      for (int n : int_list(ns)) report("fixed", n, generate(*m, ps, max_tokens, src.get(), n, false));
      report("adaptive", int_list(ns).back(), generate(*m, ps, max_tokens, src.get(), int_list(ns).back(), true));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spec_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
