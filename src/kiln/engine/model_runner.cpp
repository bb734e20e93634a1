// ModelRunner: chunks -> ragged Batch (padded for graphs) -> upload -> [graph] forward + device
// argmax -> download -> sampling. Which stage picks the tokens is decided per step from the
// backend's caps() and what the chunks need back (logprobs and processors need host rows).
#include "kiln/engine/model_runner.h"

#include <algorithm>
#include <bit>
#include <thread>
#include <unordered_map>

#include "kiln/base/thread_pool.h"

#include "kiln/engine/sequence.h"

namespace kiln::engine {

namespace {

// Where a step's tokens are chosen.
enum class Pick {
  host,           // logits rows come back; the host Sampler draws (after the processors)
  device_argmax,  // every sampled chunk is plain greedy: argmax on the device, inside the graph
  device_sample,  // the device sampler draws (Backend::sample_rows), after the graph
};

// Whether the chunk's processors are all token masks the device can apply (not in verifies: the
// engine masks their rows itself, on the host).
bool device_masks(const SeqChunk& c) {
  if (c.sample->processors.empty()) return true;
  if (c.verify) return false;
  return std::all_of(c.sample->processors.begin(), c.sample->processors.end(),
                     [](const LogitsProcessor* p) { return p->is_mask(); });
}

Pick choose_pick(std::span<const SeqChunk> chunks, const backend::Caps& caps, const RunnerConfig& cfg) {
  if (!caps.device_sampling) return Pick::host;
  bool greedy = true, verify = false, masked = false;
  for (const SeqChunk& c : chunks) {
    const int sampled_rows = !c.sample ? 0 : c.verify ? c.n_logits : 1;
    if (c.n_logits > sampled_rows) return Pick::host;  // rows read on the host (prompt logprobs)
    if (!c.sample) continue;
    if (c.sample->keep_logits || !device_masks(c)) return Pick::host;
    greedy &= plain_greedy(c.sample->sampler->params());
    verify |= c.verify;
    masked |= !c.sample->processors.empty();
  }
  // Masked rows go through the device sampler (its greedy rows: the argmax of the masked logits),
  // whose parameters are one row per chunk: verifies (a row per draft) join the host then.
  if (masked) return cfg.device_sampling && !verify ? Pick::device_sample : Pick::host;
  if (greedy) return Pick::device_argmax;
  // A sampled verify needs the target's distributions (the acceptance rule) on the host.
  return cfg.device_sampling && !verify ? Pick::device_sample : Pick::host;
}

// The device sampler's inputs for one chunk's row: its parameters, the next draw of its own
// generator (only when the host would draw: temperature > 0), and one adjustment per distinct token
// its logit bias and penalties touch.
void add_device_row(const SampleSpec& s, int row, std::vector<backend::SampleParams>& params,
                    std::vector<backend::LogitAdjust>& adjust) {
  const SamplingParams& p = s.sampler->params();
  params.push_back(device_sample_params(p, p.temperature > 0.0f ? s.sampler->next_uniform() : 0.0));
  std::unordered_map<int32_t, backend::LogitAdjust> touched;
  auto at = [&](int32_t id) -> backend::LogitAdjust& {
    auto [it, fresh] = touched.try_emplace(id);
    if (fresh) it->second.row = row, it->second.token = id;
    return it->second;
  };
  for (auto [id, b] : p.logit_bias) at(id).bias = b;
  if (p.repetition_penalty != 1.0f)
    for (int32_t id : s.context) at(id).in_context = 1;
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (int32_t id : s.generated) ++at(id).n_generated;
  for (auto& [id, a] : touched) adjust.push_back(a);
}

// Tokens per sequence when every chunk runs q tokens and wants all q logit rows (a decode step: q
// = 1; a speculative verify where every sequence drafted q - 1), else 0. Such steps are graphed.
// The masks of the chunks' sampled rows, computed on `pool` (one sequence per item: each grammar's
// state is its own) while the device runs the forward.
backend::TokenMasks row_masks(std::span<const SeqChunk> chunks, const std::vector<int>& first_row, int64_t vocab,
                              ThreadPool& pool) {
  backend::TokenMasks m;
  m.n_words = (vocab + 31) / 32;
  std::vector<size_t> which;
  for (size_t i = 0; i < chunks.size(); ++i)
    if (chunks[i].sample && !chunks[i].sample->processors.empty()) {
      which.push_back(i);
      m.rows.push_back(first_row[i] + chunks[i].n_logits - 1);
    }
  m.words.assign(which.size() * m.n_words, ~0u);
  pool.parallel_for(static_cast<int64_t>(which.size()), [&](int64_t b, int64_t e) {
    std::vector<uint32_t> one(m.n_words);
    for (int64_t k = b; k < e; ++k) {
      std::span<uint32_t> w(m.words.data() + k * m.n_words, m.n_words);
      for (LogitsProcessor* p : chunks[which[k]].sample->processors) {
        p->mask(one);
        for (int64_t j = 0; j < m.n_words; ++j) w[j] &= one[j];
      }
    }
  });
  return m;
}

int uniform_q(std::span<const SeqChunk> chunks) {
  const int q = chunks.empty() ? 0 : chunks[0].n_tokens;
  for (const SeqChunk& c : chunks)
    if (c.n_tokens != q || c.n_logits != q) return 0;
  return q <= ModelRunner::kMaxUniformTokens ? q : 0;
}

// A uniform batch of q tokens per sequence (all with logits) padded to the next bucket of
// sequences: 1, 2, 4, then multiples of 8, so a batch that shrinks or grows by one sequence at a
// time reuses a few graphs. A pad sequence is inert: tokens 0 at positions 0..q-1, KV slots -1 (not
// written), block table row 0 (it reads a valid block), greedy; its output rows are ignored.
void pad_uniform_batch(model::Batch& b, int q, std::vector<backend::SampleParams>& params) {
  const int n = b.n_seqs;
  if (n == 0 || q == 0) return;
  const int bucket = n <= 4 ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(n))) : (n + 7) / 8 * 8;
  for (int i = n; i < bucket; ++i) {
    for (int j = 0; j < q; ++j) {
      b.tokens.push_back(0);
      b.positions.push_back(j);
      b.token_seq.push_back(i);
      b.slots.push_back(-1);
      b.logit_rows.push_back(b.n_tokens() - 1);
    }
    if (!params.empty()) params.push_back({});
  }
  b.n_seqs = bucket;
  b.block_tables.resize(static_cast<size_t>(bucket) * b.max_blocks, 0);
}

// The graph key of a uniform step: its shapes, the KV cache's buffers (a graph records their
// addresses; a new cache, another engine's, must not replay old graphs) and its rotating mask (the
// attention's parameters are recorded too). Inputs uploaded before the graph opens may change freely.
uint64_t graph_key(const model::StepInputs& in, const model::KvCache& cache, bool argmax) {
  uint64_t key = 0;
  for (const Tensor* t : cache.planes()) key = key * 1000003u + reinterpret_cast<uintptr_t>(t->data);
  key = key * 1000003u + static_cast<uint64_t>(in.n_tokens);
  key = key * 1000003u + static_cast<uint64_t>(in.n_out);
  key = key * 1000003u + static_cast<uint64_t>(in.n_seqs);
  key = key * 1000003u + static_cast<uint64_t>(in.max_blocks);
  key = key * 1000003u + static_cast<uint64_t>(cache.max_kv_size);
  return key * 2u + (argmax ? 1u : 0u);
}

// The host threads that compute grammar masks during device steps (the CPU backend masks on the
// host path and never uses it). Shared by the process's runners: parallel_for calls queue.
ThreadPool& mask_pool() {
  static ThreadPool pool(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  return pool;
}

}  // namespace

ModelRunner::ModelRunner(model::Model& m, model::KvCache& cache, RunnerConfig cfg) : model_(m), cache_(cache), cfg_(cfg) {}

StepOutput ModelRunner::run(std::span<const SeqChunk> chunks) {
  backend::Backend& be = model_.backend();
  const backend::Caps caps = be.caps();
  const int bs = cache_.block_size;
  StepOutput out;

  // The ragged batch: each chunk's tokens, positions, KV slots and block table.
  model::Batch b;
  b.n_seqs = static_cast<int>(chunks.size());
  for (const SeqChunk& c : chunks) {
    KILN_ASSERT(c.n_logits >= 0 && c.n_logits <= c.n_tokens && (!c.sample || c.n_logits >= 1), "runner: bad chunk");
    KILN_ASSERT(static_cast<int64_t>(c.blocks.size()) * bs >= c.start + c.n_tokens, "runner: block table too short");
    b.max_blocks = std::max(b.max_blocks, static_cast<int>(c.blocks.size()));
  }
  // Graphs: the block-table width padded to a power of two, so decode steps reuse a few captured
  // graphs (the key includes it) instead of a new one every block_size tokens.
  if (caps.graphs) b.max_blocks = static_cast<int>(std::bit_ceil(static_cast<unsigned>(std::max(1, b.max_blocks))));
  b.block_tables.assign(static_cast<size_t>(b.n_seqs) * b.max_blocks, 0);
  for (int i = 0; i < b.n_seqs; ++i) {
    const SeqChunk& c = chunks[i];
    // (-1: a block the rotating cache gave back, which no token of the step reads: block 0 instead)
    std::transform(c.blocks.begin(), c.blocks.end(), b.block_tables.begin() + static_cast<size_t>(i) * b.max_blocks,
                   [](int32_t blk) { return std::max(blk, 0); });
    for (int pos = c.start; pos < c.start + c.n_tokens; ++pos) {
      b.tokens.push_back(c.tokens[pos]);
      b.positions.push_back(pos);
      b.token_seq.push_back(i);
      b.slots.push_back(c.blocks[pos / bs] * bs + pos % bs);
    }
    out.first_row.push_back(static_cast<int>(b.logit_rows.size()));
    for (int j = c.n_logits; j > 0; --j) b.logit_rows.push_back(b.n_tokens() - j);
  }

  const size_t n_rows = b.logit_rows.size();  // (before any padding)
  const Pick pick = choose_pick(chunks, caps, cfg_);
  const int q = uniform_q(chunks);
  std::vector<backend::SampleParams> params;  // device sampling: one per logit row
  std::vector<backend::LogitAdjust> adjust;
  if (pick == Pick::device_sample)
    for (size_t i = 0; i < chunks.size(); ++i)  // (every chunk with rows samples: choose_pick)
      if (chunks[i].sample) add_device_row(*chunks[i].sample, out.first_row[i], params, adjust);
  if (cfg_.pad_decode == RunnerConfig::PadDecode::on || (cfg_.pad_decode == RunnerConfig::PadDecode::automatic && caps.graphs))
    pad_uniform_batch(b, q, params);

  Tensor host;  // logits f32 [n_out, vocab], or ids i32 [n_out]
  {
    backend::StepScope step(be);  // per-step buffers (CUDA: the arena; nothing allocated when warm)
    model::StepInputs in = model::upload_step(model_, b);
    // Uniform steps (decodes, verifies) are recorded once per shape and replayed (CUDA graphs).
    const bool graphed = q > 0 && model_.graph_safe(in.n_tokens) &&
                         be.begin_graph(graph_key(in, cache_, pick == Pick::device_argmax));
    Tensor logits = model_.forward(in, cache_);  // [n_out, vocab] f32 on the device
    if (pick == Pick::device_argmax) {
      Tensor ids = be.alloc(DType::i32, {logits.dim(0)});  // [n_out]
      be.argmax_rows(logits, ids);
      if (graphed) be.end_graph();
      host = be.to_host(ids);
    } else if (pick == Pick::device_sample) {
      if (graphed) be.end_graph();  // the sampler's parameters change every step: after the graph
      // The forward is queued on the device by now: the grammar masks are computed meanwhile.
      const backend::TokenMasks masks = row_masks(chunks, out.first_row, logits.dim(1), mask_pool());
      Tensor ids = be.alloc(DType::i32, {logits.dim(0)});
      be.sample_rows(logits, params, adjust, ids, masks);
      host = be.to_host(ids);
    } else {
      if (graphed) be.end_graph();
      host = be.to_host(logits);
    }
  }

  out.tokens.assign(chunks.size(), -1);
  if (pick != Pick::host) {
    out.row_ids.assign(host.ptr<int32_t>(), host.ptr<int32_t>() + n_rows);
    for (size_t i = 0; i < chunks.size(); ++i)
      if (chunks[i].sample) out.tokens[i] = host.ptr<int32_t>()[out.first_row[i]];
    return out;
  }
  out.logits = host;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SampleSpec* s = chunks[i].sample;
    if (!s || chunks[i].verify) continue;
    std::span<float> l = out.row(out.first_row[i] + chunks[i].n_logits - 1);
    for (LogitsProcessor* p : s->processors) p->process(l, s->context);
    out.tokens[i] = s->sampler->sample(l, s->context, s->generated);  // leaves the processed logits in l
  }
  return out;
}

void ModelRunner::rollback(Sequence& s, int k, BlockManager& blocks) {
  if (k < 0 || k > s.n_generated())
    fail("engine", "rollback of {} tokens: the sequence has {} generated tokens", k, s.n_generated());
  s.tokens.resize(s.tokens.size() - k);
  // The last kept token runs again (its logits pick the next token; its K/V is rewritten as is).
  s.n_computed = std::min<int>(s.n_computed, static_cast<int>(s.tokens.size()) - 1);
  if (s.blocks.empty()) return;  // not admitted (or preempted): nothing cached
  const int32_t shared = blocks.truncate(s.blocks, s.n_computed, s.block_hashes, s.n_committed_blocks);
  if (shared < 0) return;
  // s continues in a private copy of a block another sequence still reads.
  backend::Backend& be = model_.backend();
  const int32_t mine = s.blocks[s.n_computed / cache_.block_size];
  for (Tensor* t : cache_.planes()) {
    Tensor dst = t->slice_rows(mine, mine + 1);
    be.copy(t->slice_rows(shared, shared + 1), dst);
  }
}

}  // namespace kiln::engine
