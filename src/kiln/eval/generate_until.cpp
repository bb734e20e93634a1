// generate_until (generate_until.h). Each batch: one step prefills every request's context
// (a chunk per sequence, the last row's logits), then one step per token decodes the sequences
// still running. KV: sequence s owns blocks [s * per_seq, (s + 1) * per_seq) of a cache sized for
// the batch's longest context + max_gen_toks.
#include "kiln/eval/generate_until.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "kiln/base/error.h"
#include "kiln/engine/model_runner.h"
#include "kiln/eval/loglikelihood.h"

namespace kiln::eval {

namespace {
constexpr int kBlock = 16;
}

std::string cut_at_stop(const std::string& text, std::span<const std::string> until) {
  size_t cut = text.size();
  for (const auto& s : until) {
    if (s.empty()) continue;
    const size_t at = text.find(s);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  return text.substr(0, cut);
}

std::vector<std::string> generate_until(model::Model& m, const tokenizer::Tokenizer& tok,
                                        std::span<const GenerateRequest> reqs, const GenerateOptions& opt) {
  const int max_length = opt.max_length > 0 ? opt.max_length : default_max_length(m.config());
  const int vocab = m.config().vocab_size;
  std::vector<std::string> out(reqs.size());
  const size_t bs = static_cast<size_t>(std::max(1, opt.batch_size));
  if (opt.progress) opt.progress(0, reqs.size());  // (the clock of a rate starts here)
  for (size_t b = 0; b < reqs.size(); b += bs) {
    const size_t e = std::min(reqs.size(), b + bs);
    const size_t n = e - b;
    struct Seq {
      std::vector<int32_t> tokens;
      size_t n_prompt = 0;
      int max_new = 0;
      bool done = false;
      std::unique_ptr<engine::Sampler> sampler;
    };
    std::vector<Seq> seqs(n);
    int per_seq = 1;
    for (size_t s = 0; s < n; ++s) {
      const GenerateRequest& r = reqs[b + s];
      if (r.context.empty()) fail("eval", "a generate_until request has an empty context");
      Seq& q = seqs[s];
      q.max_new = std::max(1, std::min(r.max_gen_toks, max_length - 1));
      // lm-eval: the context keeps its last max_length - max_gen_toks tokens.
      const size_t keep = static_cast<size_t>(std::max(1, max_length - q.max_new));
      q.tokens.assign(r.context.end() - std::min(keep, r.context.size()), r.context.end());
      for (int32_t id : q.tokens)
        if (id < 0 || id >= vocab) fail("eval", "token id {} is outside the model's vocabulary of {}", id, vocab);
      q.n_prompt = q.tokens.size();
      engine::SamplingParams sp = opt.sampling;
      sp.seed = opt.sampling.seed.value_or(0) + b + s;
      q.sampler = std::make_unique<engine::Sampler>(sp);
      per_seq = std::max(per_seq, static_cast<int>((q.n_prompt + q.max_new + kBlock - 1) / kBlock));
    }
    model::KvCache cache = model::KvCache::allocate(m.backend(), m.config(), static_cast<int>(n) * per_seq, kBlock);
    engine::ModelRunner runner(m, cache);
    std::vector<int32_t> tables(n * per_seq);
    std::iota(tables.begin(), tables.end(), 0);
    std::vector<int> computed(n, 0);  // positions whose K/V are in the cache
    while (true) {
      std::vector<engine::SeqChunk> chunks;
      std::vector<size_t> which;
      for (size_t s = 0; s < n; ++s) {
        if (seqs[s].done) continue;
        engine::SeqChunk c;
        c.tokens = seqs[s].tokens;
        c.start = computed[s];
        c.n_tokens = static_cast<int>(seqs[s].tokens.size()) - computed[s];
        c.n_logits = 1;
        c.blocks = std::span<const int32_t>(tables).subspan(s * per_seq, per_seq);
        chunks.push_back(c);
        which.push_back(s);
      }
      if (chunks.empty()) break;
      engine::StepOutput so = runner.run(chunks);
      for (size_t k = 0; k < chunks.size(); ++k) {
        Seq& q = seqs[which[k]];
        computed[which[k]] = static_cast<int>(q.tokens.size());
        std::span<float> row = so.row(so.first_row[k]);
        std::span<const int32_t> gen(q.tokens.begin() + q.n_prompt, q.tokens.end());
        const int32_t t = q.sampler->sample(row, q.tokens, gen);
        const bool eos = std::find(opt.eos_ids.begin(), opt.eos_ids.end(), t) != opt.eos_ids.end();
        if (!eos) q.tokens.push_back(t);
        const int n_new = static_cast<int>(q.tokens.size() - q.n_prompt);
        std::string text;
        if (!reqs[b + which[k]].until.empty() || eos || n_new >= q.max_new)
          text = tok.decode(std::span<const int32_t>(q.tokens).subspan(q.n_prompt));
        const std::string cut = cut_at_stop(text, reqs[b + which[k]].until);
        if (eos || n_new >= q.max_new || cut.size() < text.size()) {
          q.done = true;
          out[b + which[k]] = cut;
        }
      }
    }
    if (opt.progress) opt.progress(e, reqs.size());
  }
  return out;
}

}  // namespace kiln::eval
