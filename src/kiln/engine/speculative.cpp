// Draft sources (prompt lookup, a draft model), the acceptance rules and the draft-length policy.
#include "kiln/engine/speculative.h"

#include <algorithm>
#include <bit>
#include <random>

#include "kiln/base/log.h"
#include "kiln/engine/kv_sizing.h"
#include "kiln/engine/sequence.h"

namespace kiln::engine {

const char* spec_accept_name(SpecAccept a) { return a == SpecAccept::exact ? "exact" : "residual"; }

// ---- prompt lookup --------------------------------------------------------------------------

namespace {

class NgramDraft final : public DraftSource {
 public:
  NgramDraft(int min_match, int max_match) : min_(min_match), max_(max_match) {}
  std::string name() const override { return "prompt lookup"; }

  void propose(std::span<const DraftAsk> asks) override {
    for (const DraftAsk& a : asks) {
      a.out->tokens.clear();
      a.out->probs.clear();
      const std::span<const int32_t> t = a.seq->tokens;
      const int L = static_cast<int>(t.size());
      for (int m = std::min(max_, L - 1); m >= min_ && a.out->tokens.empty(); --m) {
        const std::span<const int32_t> suffix = t.subspan(L - m);
        // The most recent earlier occurrence [i, i + m) with at least one token after it.
        for (int i = L - m - 1; i >= 0; --i) {
          if (!std::equal(suffix.begin(), suffix.end(), t.begin() + i)) continue;
          for (int j = i + m; j < L && static_cast<int>(a.out->tokens.size()) < a.n; ++j) a.out->tokens.push_back(t[j]);
          break;
        }
      }
    }
  }

 private:
  int min_, max_;
};

}  // namespace

std::unique_ptr<DraftSource> make_ngram_draft(int min_match, int max_match) {
  if (min_match < 1 || max_match < min_match)
    fail("speculative", "prompt lookup matches {}..{} tokens; give 1 <= --spec-ngram-min <= --spec-ngram-max", min_match,
         max_match);
  return std::make_unique<NgramDraft>(min_match, max_match);
}

// ---- a draft model ---------------------------------------------------------------------------

void check_draft_tokenizer(const LoadedModel& draft, const LoadedModel& target) {
  const tokenizer::Tokenizer& a = *draft.tokenizer;
  const tokenizer::Tokenizer& b = *target.tokenizer;
  const int32_t n = std::max(a.vocab_size(), b.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    const bool in_a = id < a.vocab_size(), in_b = id < b.vocab_size();
    const std::string ta = in_a ? a.id_to_token(id) : "", tb = in_b ? b.id_to_token(id) : "";
    if (in_a && in_b && ta == tb && a.is_special(id) == b.is_special(id)) continue;
    fail("speculative",
         "the draft model {} has another tokenizer than the target {}: token id {} is {} in the draft and {} in "
         "the target; use a draft from the target's family (same tokenizer)",
         draft.path, target.path, id, in_a ? "'" + ta + "'" : "absent", in_b ? "'" + tb + "'" : "absent");
  }
  if (a.bos_id() != b.bos_id() || a.eos_id() != b.eos_id())
    fail("speculative", "the draft model {} has other BOS/EOS tokens than the target {}; use a draft from the target's family",
         draft.path, target.path);
  if (draft.config.vocab_size != target.config.vocab_size)
    log::warn("the draft model's vocab_size ({}) differs from the target's ({}); the tokenizers agree, so only the "
              "padding differs", draft.config.vocab_size, target.config.vocab_size);
}

namespace {

class DraftModel final : public DraftSource {
 public:
  DraftModel(LoadedModel& m, int target_vocab, int max_batch_tokens)
      : m_(m), target_vocab_(target_vocab), max_batch_tokens_(std::max(1, max_batch_tokens)) {}
  std::string name() const override { return "draft model " + m_.path; }

  void reserve(int n_blocks, int block_size) override {
    blocks_ = std::make_unique<BlockManager>(n_blocks, block_size);
    cache_ = std::make_unique<model::KvCache>(model::KvCache::allocate(m_.model->backend(), m_.config, n_blocks, block_size));
    runner_ = std::make_unique<ModelRunner>(*m_.model, *cache_);
  }

  void prefill(std::span<const Sequence* const> seqs) override {
    std::vector<Work> work;
    for (const Sequence* s : seqs) {
      if (static_cast<int>(s->tokens.size()) > max_context()) continue;
      Work w{s, &state(*s), s->tokens, 0, nullptr};
      w.target = static_cast<int>(w.ctx.size()) - 1;  // the last token runs with the first proposal
      if (sync(w)) work.push_back(std::move(w));
    }
    catch_up(work, false);
    store(work);
  }

  void propose(std::span<const DraftAsk> asks) override {
    KILN_ASSERT(runner_, "draft model: reserve() first");
    std::vector<Work> work;
    for (const DraftAsk& a : asks) {
      a.out->tokens.clear();
      a.out->probs.clear();
      const int L = static_cast<int>(a.seq->tokens.size());
      const int n = std::min(a.n, max_context() - L);
      if (n <= 0) continue;
      Work w{a.seq, &state(*a.seq), a.seq->tokens, L, a.out, n, 0, a.probs};
      if (sync(w) && blocks_->ensure(w.st->blocks, L + n - 1)) work.push_back(std::move(w));
    }
    catch_up(work, true);  // the first draft from the last token's logits
    for (int j = 1;; ++j) {  // then one token per round
      std::vector<Work*> round;
      for (Work& w : work)
        if (static_cast<int>(w.out->tokens.size()) == j && j < w.n) round.push_back(&w);
      if (round.empty()) break;
      std::vector<SeqChunk> chunks;
      std::vector<SampleSpec> specs(round.size());
      for (size_t i = 0; i < round.size(); ++i) {
        Work& w = *round[i];
        w.ctx.push_back(w.out->tokens.back());
        chunks.push_back(chunk(w, static_cast<int>(w.ctx.size()) - 1, 1, true, specs[i]));
      }
      take_drafts(round, chunks, runner_->run(chunks));
    }
    store(work);
  }
  // (commit: nothing to do; the next sync keeps the prefix that still agrees with the sequence.)

  void forget(int64_t seq_id) override {
    auto it = states_.find(seq_id);
    if (it == states_.end()) return;
    blocks_->release(it->second.blocks);
    states_.erase(it);
  }

  size_t weight_bytes() const override {
    size_t n = 0;
    for (const std::string& name : m_.weights.names()) n += m_.weights.get(name).nbytes();
    return n;
  }
  size_t kv_bytes(int n_tokens) const override { return kv_bytes_per_block(*m_.model, n_tokens); }
  size_t activation_bytes(int max_batch_tokens) const override {
    return activation_reserve_bytes(m_.config, max_batch_tokens, dtype_size(m_.model->backend().act_dtype()));
  }
  int max_context() const override { return m_.config.max_position_embeddings; }

 private:
  struct State {
    std::vector<int32_t> tokens;  // the tokens whose K/V are in the draft's cache, in order
    std::vector<int32_t> blocks;
    Sampler sampler;
  };
  // One sequence's pass: ctx = its tokens, then the drafts so far; K/V are in the cache for
  // ctx[0, computed); the catch-up runs to `target`.
  struct Work {
    const Sequence* seq;
    State* st;
    std::vector<int32_t> ctx;
    int target;
    Draft* out;
    int n = 0;
    int computed = 0;
    bool probs = false;  // draw here and keep q (else the runner samples)
  };

  static int common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
    return static_cast<int>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
  }

  // The draft samples with the request's parameters and its own generator (seeded from the
  // request's seed, so a seeded request drafts the same way every time).
  State& state(const Sequence& s) {
    auto it = states_.find(s.id);
    if (it != states_.end()) return it->second;
    SamplingParams p = s.sampler.params();
    if (p.seed) p.seed = *p.seed ^ 0x9E3779B97F4A7C15ull;
    return states_.emplace(s.id, State{{}, {}, Sampler(p)}).first->second;
  }

  // The cached tokens that still agree with ctx (a rejection or a roll-back ends the agreement),
  // and blocks for the catch-up; false when the pool is out of blocks.
  bool sync(Work& w) {
    w.computed = std::min(common_prefix(w.st->tokens, w.ctx), static_cast<int>(w.ctx.size()) - 1);
    w.st->tokens.resize(w.computed);
    return blocks_->ensure(w.st->blocks, std::max<int>(w.target, 1));
  }

  SeqChunk chunk(Work& w, int start, int n_tokens, bool logits, SampleSpec& spec) {
    SeqChunk c{w.ctx, start, n_tokens, w.st->blocks, logits ? 1 : 0, nullptr};
    // The residual rule needs a sampled draft's distribution: the row comes back instead.
    if (logits && !w.probs) {
      spec = {&w.st->sampler, w.ctx, std::span<const int32_t>(w.ctx).subspan(w.seq->n_prompt), {}, false};
      c.sample = &spec;
      // A greedy catch-up of a few tokens asks every row's argmax, as a verify does: a batch of
      // such chunks is uniform, so it replays a graph like decode (the last row is the draft).
      if (n_tokens > 1 && n_tokens <= ModelRunner::kMaxUniformTokens && plain_greedy(w.st->sampler.params()))
        c.n_logits = n_tokens, c.verify = true;
    }
    w.computed = start + n_tokens;
    return c;
  }

  // Runs each work's ctx[computed, target) in batches of at most max_batch_tokens; with `draft`,
  // the last position's logits give the first draft token.
  void catch_up(std::vector<Work>& work, bool draft) {
    size_t next = 0;
    while (next < work.size()) {
      std::vector<Work*> batch;
      std::vector<SeqChunk> chunks;
      std::vector<SampleSpec> specs(work.size());
      int budget = max_batch_tokens_;
      while (next < work.size() && budget > 0) {
        Work& w = work[next];
        const int left = w.target - w.computed;
        const int t = std::min(left, budget);
        if (t > 0) {
          const bool last = t == left && draft;
          chunks.push_back(chunk(w, w.computed, t, last, specs[batch.size()]));
          batch.push_back(&w);
          budget -= t;
        }
        if (t == left) ++next;
      }
      if (chunks.empty()) continue;
      StepOutput out = runner_->run(chunks);
      if (draft) take_drafts(batch, chunks, out);
    }
  }

  // What each sequence's cache now holds: its context up to the last position run.
  static void store(std::vector<Work>& work) {
    for (Work& w : work) w.st->tokens.assign(w.ctx.begin(), w.ctx.begin() + w.computed);
  }

  // The draft token of every chunk that asked for logits (sampled by the runner, or drawn here from
  // the row's distribution, which is kept for the residual rule).
  void take_drafts(std::span<Work* const> ws, std::span<const SeqChunk> chunks, const StepOutput& out) {
    for (size_t i = 0; i < ws.size(); ++i) {
      if (chunks[i].n_logits == 0) continue;  // (a catch-up cut by the token budget)
      Work& w = *ws[i];
      const int last = out.first_row[i] + chunks[i].n_logits - 1;
      int32_t tok = !chunks[i].verify ? out.tokens[i] : out.row_ids.empty() ? argmax(out.row(last)) : out.row_ids[last];
      std::vector<float> q;
      if (!chunks[i].sample) {
        w.st->sampler.distribution(out.row(last), w.ctx, std::span<const int32_t>(w.ctx).subspan(w.seq->n_prompt), q);
        tok = w.st->sampler.draw(q);
      }
      if (tok >= target_vocab_) {  // a padding id: the draft ends before it
        w.n = static_cast<int>(w.out->tokens.size());
        continue;
      }
      w.out->tokens.push_back(tok);
      if (!q.empty()) {
        q.resize(target_vocab_, 0.0f);  // over the target's ids (a draft's padding ids hold no mass here)
        w.out->probs.push_back(std::move(q));
      }
    }
  }

  LoadedModel& m_;
  int target_vocab_;
  int max_batch_tokens_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<model::KvCache> cache_;
  std::unique_ptr<ModelRunner> runner_;
  std::map<int64_t, State> states_;
};

}  // namespace

std::unique_ptr<DraftSource> make_draft_model(LoadedModel& draft, const LoadedModel& target, int max_batch_tokens) {
  check_draft_tokenizer(draft, target);
  if (draft.config.max_position_embeddings < target.config.max_position_embeddings)
    log::warn("the draft model's context ({} tokens) is shorter than the target's ({}); longer sequences go on "
              "without drafts", draft.config.max_position_embeddings, target.config.max_position_embeddings);
  return std::make_unique<DraftModel>(draft, target.config.vocab_size, max_batch_tokens);
}

// ---- acceptance ------------------------------------------------------------------------------

Verdict accept_greedy(std::span<const int32_t> row_argmax, std::span<const int32_t> drafts) {
  Verdict v;
  while (v.n_accepted < static_cast<int>(drafts.size()) && row_argmax[v.n_accepted] == drafts[v.n_accepted])
    v.tokens.push_back(drafts[v.n_accepted++]);
  v.tokens.push_back(row_argmax[v.n_accepted]);
  return v;
}

Verdict accept_sampled(SpecAccept rule, std::span<std::vector<float>> p, const Draft& d, Sampler& sampler) {
  Verdict v;
  const int n = static_cast<int>(d.tokens.size());
  for (int j = 0; j < n; ++j) {
    const int32_t t = d.tokens[j];
    std::vector<float>& pj = p[j];
    if (rule == SpecAccept::exact) {
      const int32_t y = sampler.draw(pj);
      v.tokens.push_back(y);
      if (y != t) return v;
      ++v.n_accepted;
      continue;
    }
    const float q = d.probs.empty() ? 1.0f : d.probs[j][t];
    if (q > 0.0f && sampler.next_uniform() * q < pj[t]) {  // u < p/q
      v.tokens.push_back(t);
      ++v.n_accepted;
      continue;
    }
    // Rejected: draw from max(0, p - q) normalized (a point-mass q: p without t).
    double mass = 0;
    for (size_t i = 0; i < pj.size(); ++i) {
      const float qi = d.probs.empty() ? (static_cast<int32_t>(i) == t ? 1.0f : 0.0f) : d.probs[j][i];
      pj[i] = std::max(0.0f, pj[i] - qi);
      mass += pj[i];
    }
    if (mass > 0)
      for (float& x : pj) x = static_cast<float>(x / mass);
    else  // p <= q everywhere, so p == q: any draw from p is right
      pj[t] = 1.0f;
    v.tokens.push_back(sampler.draw(pj));
    return v;
  }
  v.tokens.push_back(sampler.draw(p[n]));  // all accepted: the bonus token
  return v;
}

// ---- the policy ------------------------------------------------------------------------------

int SpecPolicy::bucket(int batch_size) {
  return std::min(kBuckets - 1, static_cast<int>(std::bit_width(static_cast<unsigned>(std::max(1, batch_size) - 1))));
}

SpecPolicy::Bucket& SpecPolicy::at(int batch_size) {
  Bucket& b = buckets_[bucket(batch_size)];
  if (b.arms.empty()) b.arms.resize(max_n_ + 1);
  return b;
}

int SpecPolicy::best(const Bucket& b) {
  int best = 0;
  for (int n = 1; n < static_cast<int>(b.arms.size()); ++n)
    if (b.arms[n].rate > b.arms[best].rate) best = n;
  return best;
}

int SpecPolicy::choose(int batch_size) {
  if (max_n_ <= 0) return 0;
  Bucket& b = at(batch_size);
  ++b.step;
  // First the longest draft and no draft, so both ends are measured.
  for (int n : {max_n_, 0})
    if (b.arms[n].count < 2) return n;
  const int top = best(b);
  if (top != 0 && b.step % kBaselineEvery == 0) return 0;
  if (b.step >= b.next_probe) {  // a neighbour of the best, alternately above and below
    const int up = std::min(max_n_, top + 1), down = std::max(0, top - 1);
    b.probing = (b.step / b.interval) % 2 ? (up != top ? up : down) : (down != top ? down : up);
    b.next_probe = b.step + b.interval;
    return b.probing;
  }
  return top;
}

void SpecPolicy::record(int batch_size, int n, int tokens, double seconds) {
  if (max_n_ <= 0 || seconds <= 0) return;
  Bucket& b = at(batch_size);
  Arm& a = b.arms[std::clamp(n, 0, max_n_)];
  const double r = tokens / seconds;
  a.rate = a.count == 0 ? r : 0.7 * a.rate + 0.3 * r;
  ++a.count;
  if (n != b.probing) return;
  // A probe that loses waits twice as long before the next (a draft model that skipped steps pays
  // a catch-up on each probe); one that wins brings probing back to its base rate.
  b.probing = -1;
  b.interval = best(b) == n ? kProbeEvery : std::min(kMaxProbeEvery, 2 * b.interval);
  b.next_probe = b.step + b.interval;
}

}  // namespace kiln::engine
