// Loglikelihood scoring (loglikelihood.h). Shapes: a request runs positions [0, L - 1) of
// whole = context + continuation (L tokens; the last token is only predicted); its continuation's
// c tokens are predicted by the last c rows of logits [rows, vocab] (host f32).
// Grouping: a group of requests with the same context (length n) computes the context's first
// P = 16 * floor((n - 1) / 16) positions once into shared blocks (one chunk, its own forward);
// then each request is one chunk from position P over the shared blocks plus blocks of its own
// (the shared blocks are only read, so the group's requests can share one forward). P < n keeps
// at least one context token in every request's chunk, so no request writes a shared block.
#include "kiln/eval/loglikelihood.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "kiln/base/error.h"
#include "kiln/base/thread_pool.h"
#include "kiln/engine/model_runner.h"
#include "kiln/eval/perplexity.h"

namespace kiln::eval {

namespace {

constexpr int kBlock = 16;

int blocks_for(size_t n) { return static_cast<int>((n + kBlock - 1) / kBlock); }

// A request after lm-eval's left truncation: whole = context + continuation, cont = its last tokens.
struct Prepared {
  std::vector<int32_t> whole;
  size_t n_ctx = 0, n_cont = 0;
};

Prepared prepare(const LoglikelihoodRequest& r, int max_length, int vocab) {
  if (r.context.empty()) fail("eval", "a loglikelihood request needs a context token (lm-eval puts the prefix token in an empty one)");
  if (r.continuation.empty()) fail("eval", "a loglikelihood request has an empty continuation");
  Prepared p;
  p.whole = r.context;
  p.whole.insert(p.whole.end(), r.continuation.begin(), r.continuation.end());
  for (int32_t id : p.whole)
    if (id < 0 || id >= vocab) fail("eval", "token id {} is outside the model's vocabulary of {}", id, vocab);
  const size_t keep = static_cast<size_t>(max_length) + 1;
  if (p.whole.size() > keep) p.whole.erase(p.whole.begin(), p.whole.end() - keep);
  p.n_cont = std::min(r.continuation.size(), p.whole.size() - 1);
  p.n_ctx = p.whole.size() - p.n_cont;
  return p;
}

struct Group {
  std::vector<size_t> members;  // request indices
  size_t shared = 0;            // P: positions computed once for the group
};

}  // namespace

int default_max_length(const model::ModelConfig& c) {
  return c.max_position_embeddings > 0 ? c.max_position_embeddings : 2048;
}

std::vector<LoglikelihoodResult> loglikelihood(model::Model& m, std::span<const LoglikelihoodRequest> reqs,
                                               const ScoreOptions& opt) {
  const int vocab = m.config().vocab_size;
  const int max_length = opt.max_length > 0 ? opt.max_length : default_max_length(m.config());
  std::vector<Prepared> prep;
  prep.reserve(reqs.size());
  for (const auto& r : reqs) prep.push_back(prepare(r, max_length, vocab));

  // Groups in order of first appearance; a context seen once runs whole (nothing to share).
  std::vector<Group> groups;
  if (opt.group_prefixes) {
    std::map<std::vector<int32_t>, size_t> index;
    for (size_t i = 0; i < prep.size(); ++i) {
      std::vector<int32_t> ctx(prep[i].whole.begin(), prep[i].whole.begin() + prep[i].n_ctx);
      auto [it, fresh] = index.try_emplace(std::move(ctx), groups.size());
      if (fresh) groups.emplace_back();
      groups[it->second].members.push_back(i);
    }
    for (auto& g : groups)
      if (g.members.size() > 1) g.shared = (prep[g.members[0]].n_ctx - 1) / kBlock * kBlock;
  } else {
    for (size_t i = 0; i < prep.size(); ++i) groups.push_back({{i}, 0});
  }

  // Batches: whole groups until batch_size requests (a bigger group is a batch of its own).
  const size_t bs = static_cast<size_t>(std::max(1, opt.batch_size));
  std::vector<std::pair<size_t, size_t>> batches;  // [first group, end group)
  for (size_t g = 0; g < groups.size();) {
    size_t e = g, n = 0;
    while (e < groups.size() && (e == g || n + groups[e].members.size() <= bs)) n += groups[e++].members.size();
    batches.emplace_back(g, e);
    g = e;
  }
  // One cache for the largest batch: each group's shared blocks, then each request's own.
  auto batch_blocks = [&](size_t gb, size_t ge) {
    int n = 0;
    for (size_t g = gb; g < ge; ++g) {
      n += static_cast<int>(groups[g].shared / kBlock);
      for (size_t i : groups[g].members)
        n += blocks_for(prep[i].whole.size() - 1) - static_cast<int>(groups[g].shared / kBlock);
    }
    return n;
  };
  int max_blocks = 1;
  for (auto [gb, ge] : batches) max_blocks = std::max(max_blocks, batch_blocks(gb, ge));
  model::KvCache cache = model::KvCache::allocate(m.backend(), m.config(), max_blocks, kBlock);
  engine::ModelRunner runner(m, cache);

  std::vector<LoglikelihoodResult> out(reqs.size());
  if (opt.progress) opt.progress(0, reqs.size());  // (the clock of a rate starts here)
  size_t done = 0;
  for (auto [gb, ge] : batches) {
    // Block tables: tables[i] for request i of the batch (shared blocks first).
    std::map<size_t, std::vector<int32_t>> tables;
    std::vector<engine::SeqChunk> prefix_chunks, chunks;
    std::vector<size_t> order;  // request index of each chunk
    int next_block = 0;
    std::vector<std::vector<int32_t>> shared_tables(ge - gb);
    for (size_t g = gb; g < ge; ++g) {
      const Group& gr = groups[g];
      auto& st = shared_tables[g - gb];
      for (size_t b = 0; b < gr.shared / kBlock; ++b) st.push_back(next_block++);
      for (size_t i : gr.members) {
        auto& t = tables[i];
        t = st;
        while (t.size() < static_cast<size_t>(blocks_for(prep[i].whole.size() - 1))) t.push_back(next_block++);
      }
    }
    for (size_t g = gb; g < ge; ++g) {
      const Group& gr = groups[g];
      if (gr.shared > 0) {
        engine::SeqChunk c;
        c.tokens = std::span<const int32_t>(prep[gr.members[0]].whole).first(gr.shared);
        c.start = 0;
        c.n_tokens = static_cast<int>(gr.shared);
        c.n_logits = 1;  // (unused: the runner returns rows)
        c.blocks = shared_tables[g - gb];
        prefix_chunks.push_back(c);
      }
      for (size_t i : gr.members) {
        const Prepared& p = prep[i];
        engine::SeqChunk c;
        c.tokens = std::span<const int32_t>(p.whole).first(p.whole.size() - 1);
        c.start = static_cast<int>(gr.shared);
        c.n_tokens = static_cast<int>(p.whole.size() - 1 - gr.shared);
        c.n_logits = static_cast<int>(p.n_cont);
        c.blocks = tables[i];
        chunks.push_back(c);
        order.push_back(i);
      }
    }
    if (!prefix_chunks.empty()) runner.run(prefix_chunks);
    engine::StepOutput so = runner.run(chunks);
    // Each continuation token's log-probability and greedy flag, rows spread over the host's
    // threads (a 128k vocabulary makes this as long as the forward), then summed per request.
    struct Row {
      size_t k, j;
      double logprob = 0;
      bool greedy = true;
    };
    std::vector<Row> rows;
    for (size_t k = 0; k < chunks.size(); ++k)
      for (size_t j = 0; j < prep[order[k]].n_cont; ++j) rows.push_back({k, j});
    ThreadPool::global().parallel_for(static_cast<int64_t>(rows.size()), [&](int64_t b, int64_t e) {
      std::vector<double> lp;
      for (int64_t i = b; i < e; ++i) {
        Row& w = rows[i];
        const Prepared& p = prep[order[w.k]];
        std::span<float> row = so.row(so.first_row[w.k] + static_cast<int>(w.j));
        const int32_t tok = p.whole[p.n_ctx + w.j];
        log_softmax(row.data(), vocab, lp);
        w.logprob = lp[tok];
        w.greedy = engine::argmax(row) == tok;
      }
    });
    for (const Row& w : rows) {  // (in order: the sums do not depend on the threads)
      LoglikelihoodResult& r = out[order[w.k]];
      r.logprob += w.logprob;
      r.is_greedy = r.is_greedy && w.greedy;
    }
    done += chunks.size();
    if (opt.progress) opt.progress(done, reqs.size());
  }
  return out;
}

std::vector<LoglikelihoodRequest> rolling_windows(std::span<const int32_t> tokens, int32_t prefix_token,
                                                  int max_seq_len) {
  std::vector<LoglikelihoodRequest> out;
  if (tokens.empty()) return out;
  if (max_seq_len < 1) fail("eval", "rolling windows need a max length of at least 1, got {}", max_seq_len);
  const size_t L = static_cast<size_t>(max_seq_len), n = tokens.size();
  const size_t first = std::min(L, n);
  out.push_back({{prefix_token}, {tokens.begin(), tokens.begin() + first}});
  for (size_t predicted = first; predicted < n;) {
    const size_t pred = std::min(n - predicted, L);
    const size_t end = predicted + pred;
    // Window tokens[end - L - 1, end - 1) (L tokens), disjoint: context = its part before the predicted.
    out.push_back({{tokens.begin() + (end - L - 1), tokens.begin() + (end - pred)},
                   {tokens.begin() + (end - pred), tokens.begin() + end}});
    predicted = end;
  }
  return out;
}

}  // namespace kiln::eval
