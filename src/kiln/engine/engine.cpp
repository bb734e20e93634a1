// Engine::step: schedule -> build the ragged Batch -> forward -> sample -> report.
#include "kiln/engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <unordered_map>

#include "kiln/base/log.h"
#include "kiln/engine/kv_sizing.h"

namespace kiln::engine {

// The KV pool (kv_sizing.h): what the workload can use (explicit n_blocks, else max_seqs full
// contexts), or --kv-cache-bytes, plus the prefix cache's blocks; on a GPU capped to the
// --gpu-memory-utilization budget measured now, with the weights already on the device.
static BlockManager make_blocks(model::Model& m, const EngineConfig& cfg) {
  const model::ModelConfig& c = m.config();
  backend::Backend& be = m.backend();
  KvPoolRequest r;
  r.bytes_per_block = kv_bytes_per_block(c, cfg.block_size, dtype_size(be.act_dtype()));
  const int per_seq = (c.max_position_embeddings + cfg.block_size - 1) / cfg.block_size;
  r.wanted_blocks = cfg.n_blocks > 0 ? cfg.n_blocks : per_seq * std::max(1, cfg.scheduler.max_seqs);
  r.kv_cache_bytes = cfg.kv_cache_bytes;
  r.prompt_cache_bytes = cfg.prompt_cache_bytes;
  r.gpu_memory_utilization = cfg.gpu_memory_utilization;
  if (be.device_memory(&r.device_free, &r.device_total))
    r.activation_reserve = activation_reserve_bytes(c, cfg.scheduler.max_batch_tokens, dtype_size(be.act_dtype()));
  const KvPoolPlan plan = plan_kv_pool(r);
  if (plan.capped)
    log::info("KV cache: {} blocks ({:.2f} GB), capped by --gpu-memory-utilization {} (the workload could use {})",
              plan.active_blocks, static_cast<double>(plan.active_blocks) * r.bytes_per_block / 1e9,
              cfg.gpu_memory_utilization, r.wanted_blocks);
  return BlockManager(plan.active_blocks + plan.cached_blocks, cfg.block_size,
                      PrefixCacheConfig{plan.cached_blocks, cfg.model_key});
}

Engine::Engine(model::Model& model, EngineConfig cfg)
    : model_(model),
      cfg_(cfg),
      blocks_(make_blocks(model, cfg)),
      cache_(model::KvCache::allocate(model.backend(), model.config(), blocks_.n_blocks(), cfg.block_size)),
      scheduler_(cfg.scheduler, blocks_),
      context_length_(model.config().max_position_embeddings) {}

Engine::~Engine() = default;

int64_t Engine::add(Request r) {
  if (r.prompt.empty()) fail("engine", "the prompt is empty; give at least one token");
  if (static_cast<int>(r.prompt.size()) >= context_length_)
    fail("engine", "the prompt has {} tokens; the model's context is {} tokens", r.prompt.size(), context_length_);
  if (blocks_.blocks_for(r.prompt.size() + 1) > blocks_.n_blocks())
    fail("engine", "the prompt needs {} KV blocks but the cache has {}; raise the KV cache size",
         blocks_.blocks_for(r.prompt.size() + 1), blocks_.n_blocks());
  const int vocab = model_.config().vocab_size;
  for (int32_t t : r.prompt)
    if (t < 0 || t >= vocab) fail("engine", "token id {} is outside the vocabulary (0..{})", t, vocab - 1);
  if (r.max_tokens < 0) fail("engine", "max_tokens is {}; it must be 0 or more", r.max_tokens);
  // Never generate past the context.
  r.max_tokens = std::min<int>(r.max_tokens, context_length_ - static_cast<int>(r.prompt.size()));
  int64_t id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, std::move(r));
  scheduler_.add(seq.get());
  seqs_.emplace(id, std::move(seq));
  return id;
}

void Engine::finish(Sequence* s, FinishReason r) {
  s->finish = r;
  scheduler_.remove(s);
  auto cb = std::move(s->on_event);
  int64_t id = s->id;
  seqs_.erase(id);
  if (cb && r == FinishReason::cancelled) cb(make_event(id, -1, true, r));
}

void Engine::abort_all(const std::string& message) {
  while (!seqs_.empty()) {
    Sequence* s = seqs_.begin()->second.get();
    auto cb = s->on_event;
    int64_t id = s->id;
    finish(s, FinishReason::error);
    if (cb) cb(make_event(id, -1, true, FinishReason::error, message));
  }
}

void Engine::cancel(int64_t id) {
  auto it = seqs_.find(id);
  if (it != seqs_.end()) finish(it->second.get(), FinishReason::cancelled);
}

// Prompt logprobs are still to be computed (not yet reported: a sequence recomputed after a
// preemption has handed them over already).
static bool wants_prompt_logprobs(const Sequence& s) {
  return s.prompt_logprobs >= 0 && s.n_computed < s.n_prompt && !s.prompt_lp.empty();
}

// Every sequence that samples this step is greedy with no logit processors or logprobs, so the
// argmax of its logits is its token (the GPU computes it on the device: Batch::greedy_only).
static bool all_plain_greedy(const std::vector<ScheduledChunk>& chunks) {
  for (const ScheduledChunk& c : chunks) {
    const Sequence& s = *c.seq;
    if (wants_prompt_logprobs(s)) return false;
    if (!c.wants_logits) continue;
    const SamplingParams& p = s.sampler.params();
    if (p.temperature > 0.0f || !p.logit_bias.empty() || p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
        p.frequency_penalty != 0.0f || s.logprobs >= 0)
      return false;
  }
  return true;
}

// Sequences that sample this step need no logprobs (prompt or sampled), so the GPU may draw their
// tokens itself (Backend::sample_rows) and only the ids leave the device.
static bool no_logprobs(const std::vector<ScheduledChunk>& chunks) {
  for (const ScheduledChunk& c : chunks)
    if (wants_prompt_logprobs(*c.seq) || (c.wants_logits && c.seq->logprobs >= 0)) return false;
  return true;
}

// The device sampler's inputs for one sequence's logit row: its parameters, the next draw of its
// own generator (only when the host would draw: temperature > 0 and a token is due), and one
// adjustment per distinct token its logit bias and penalties touch.
static void add_device_row(Sequence& s, int row, std::vector<backend::SampleParams>& params,
                           std::vector<backend::LogitAdjust>& adjust) {
  const SamplingParams& p = s.sampler.params();
  backend::SampleParams d;
  if (s.max_tokens > 0)  // else nothing is sampled: the row's argmax is ignored
    d = device_sample_params(p, p.temperature > 0.0f ? s.sampler.next_uniform() : 0.0);
  params.push_back(d);
  if (s.max_tokens == 0) return;
  std::unordered_map<int32_t, backend::LogitAdjust> touched;
  auto at = [&](int32_t id) -> backend::LogitAdjust& {
    auto [it, fresh] = touched.try_emplace(id);
    if (fresh) it->second.row = row, it->second.token = id;
    return it->second;
  };
  for (auto [id, b] : p.logit_bias) at(id).bias = b;
  if (p.repetition_penalty != 1.0f)
    for (int32_t id : s.tokens) at(id).in_context = 1;
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (size_t i = s.n_prompt; i < s.tokens.size(); ++i) ++at(s.tokens[i]).n_generated;
  for (auto& [id, a] : touched) adjust.push_back(a);
}

// GPU decode steps replay CUDA graphs keyed by the batch shape. So that a batch that shrinks or
// grows by one sequence at a time reuses a few graphs instead of capturing one per size, a decode-only
// batch (one token and one logit row per sequence) is padded to the next bucket: 1, 2, 4, then
// multiples of 8. A pad row is its own empty sequence: token 0 at position 0, KV slot -1 (not
// written), block table row 0 (it reads a valid block), greedy; its output row is ignored.
static void pad_decode_batch(model::Batch& b) {
  const int n = b.n_tokens();
  if (n == 0 || n != b.n_seqs || static_cast<int>(b.logit_rows.size()) != n) return;
  const int bucket = n <= 4 ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(n))) : (n + 7) / 8 * 8;
  for (int i = n; i < bucket; ++i) {
    b.tokens.push_back(0);
    b.positions.push_back(0);
    b.token_seq.push_back(i);
    b.slots.push_back(-1);
    b.logit_rows.push_back(i);
    if (!b.sample_params.empty()) b.sample_params.push_back({});
  }
  b.n_seqs = bucket;
  b.block_tables.resize(static_cast<size_t>(bucket) * b.max_blocks, 0);
}

int Engine::step() {
  auto chunks = scheduler_.schedule();
  if (chunks.empty()) return 0;
  auto t0 = std::chrono::steady_clock::now();

  // Build the ragged batch: each chunk's tokens, positions, KV slots and block table.
  model::Batch b;
  b.n_seqs = static_cast<int>(chunks.size());
  for (auto& c : chunks) b.max_blocks = std::max(b.max_blocks, static_cast<int>(c.seq->blocks.size()));
  // GPU: the block-table width padded to a power of two, so decode steps reuse a few captured
  // graphs (the key includes it) instead of a new one every block_size tokens.
  if (model_.backend().device() == Device::cuda) b.max_blocks = static_cast<int>(std::bit_ceil(static_cast<unsigned>(std::max(1, b.max_blocks))));
  b.block_tables.assign(static_cast<size_t>(b.n_seqs) * b.max_blocks, 0);
  bool any_prefill = false;
  std::vector<int> first_row(chunks.size());  // each chunk's first row in the returned logits
  for (int i = 0; i < b.n_seqs; ++i) {
    Sequence* s = chunks[i].seq;
    std::copy(s->blocks.begin(), s->blocks.end(), b.block_tables.begin() + static_cast<size_t>(i) * b.max_blocks);
    for (int j = 0; j < chunks[i].n_tokens; ++j) {
      int pos = s->n_computed + j;
      b.tokens.push_back(s->tokens[pos]);
      b.positions.push_back(pos);
      b.token_seq.push_back(i);
      b.slots.push_back(s->blocks[pos / blocks_.block_size()] * blocks_.block_size() + pos % blocks_.block_size());
    }
    first_row[i] = static_cast<int>(b.logit_rows.size());
    if (wants_prompt_logprobs(*s)) {
      // Prompt logprobs: every position's logits (the row of position p scores token p + 1).
      for (int j = chunks[i].n_tokens; j > 0; --j) b.logit_rows.push_back(b.n_tokens() - j);
    } else if (chunks[i].wants_logits) {
      b.logit_rows.push_back(b.n_tokens() - 1);
    }
    any_prefill |= chunks[i].n_tokens > 1 || s->n_computed < s->n_prompt;
  }

  // GPU: when every sampled sequence is plain greedy, only the argmax ids leave the device.
  b.greedy_only = model_.backend().device() == Device::cuda && all_plain_greedy(chunks);
  // GPU, sampled rows, no logprobs: the device draws the tokens (the host Sampler's semantics).
  if (!b.greedy_only && cfg_.device_sampling && model_.backend().device() == Device::cuda && no_logprobs(chunks)) {
    for (size_t ci = 0; ci < chunks.size(); ++ci)
      if (chunks[ci].wants_logits) add_device_row(*chunks[ci].seq, first_row[ci], b.sample_params, b.sample_adjust);
  }
  const int n_real_tokens = b.n_tokens();
  if (cfg_.pad_decode == EngineConfig::PadDecode::on ||
      (cfg_.pad_decode == EngineConfig::PadDecode::automatic && model_.backend().device() == Device::cuda))
    pad_decode_batch(b);
  Tensor logits = model_.forward(b, cache_);  // [n_out, vocab] host f32 (returns_ids(): i32 ids [n_out])
  const int32_t* greedy_ids = b.returns_ids() ? logits.ptr<int32_t>() : nullptr;
  const int64_t vocab = b.returns_ids() ? 0 : logits.dim(1);

  auto row_span = [&](int row) { return std::span<float>(logits.ptr<float>() + static_cast<int64_t>(row) * vocab, vocab); };
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const ScheduledChunk& c = chunks[ci];
    Sequence* s = c.seq;
    int row = first_row[ci];
    if (wants_prompt_logprobs(*s)) {
      for (int j = 0; j < c.n_tokens; ++j) {
        int pos = s->n_computed + j;
        if (pos + 1 >= s->n_prompt) break;
        auto& e = s->prompt_lp[pos + 1];
        e.assign(1, {s->tokens[pos + 1], 0.0f});
        std::vector<TokenLogprob> top;
        e[0].logprob = log_softmax_at(row_span(row + j), s->tokens[pos + 1], s->prompt_logprobs, &top);
        e.insert(e.end(), top.begin(), top.end());
      }
      row += c.n_tokens - 1;  // the sampling row is the chunk's last
    }
    if (s->n_computed < s->n_prompt) stats_.prompt_tokens += std::min(c.n_tokens, s->n_prompt - s->n_computed);
    s->n_computed += c.n_tokens;
    blocks_.commit(s->tokens, s->n_computed, s->blocks, s->block_hashes, s->n_committed_blocks);
    if (!c.wants_logits) continue;
    TokenEvent ev = make_event(s->id, -1, false, FinishReason::none);
    ev.n_cached = std::max(0, s->n_cached);
    if (s->n_generated() == 0) {
      ev.prompt_logprobs = std::move(s->prompt_lp);
      s->prompt_lp.clear();
    }
    if (s->max_tokens == 0) {  // prompt only (echo + logprobs scoring): nothing to sample
      ev.finished = true;
      ev.reason = FinishReason::length;
      if (s->on_event) s->on_event(ev);
      finish(s, FinishReason::length);
      continue;
    }
    std::span<float> l = row_span(row);
    std::span<const int32_t> gen(s->tokens.data() + s->n_prompt, s->n_generated());
    int32_t tok = greedy_ids ? greedy_ids[row] : s->sampler.sample(l, s->tokens, gen);  // leaves the processed logits in l
    if (s->logprobs >= 0) ev.logprob = log_softmax_at(l, tok, s->logprobs, &ev.top);
    s->tokens.push_back(tok);
    ++stats_.generated_tokens;
    FinishReason r = FinishReason::none;
    if (std::find(s->stop_ids.begin(), s->stop_ids.end(), tok) != s->stop_ids.end()) r = FinishReason::stop;
    else if (s->n_generated() >= s->max_tokens) r = FinishReason::length;
    ev.token = tok;
    ev.finished = r != FinishReason::none;
    ev.reason = r;
    if (s->on_event) s->on_event(ev);
    if (r != FinishReason::none) finish(s, r);
  }
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (any_prefill ? stats_.prefill_seconds : stats_.decode_seconds) += dt;
  ++stats_.steps;
  return n_real_tokens;
}

}  // namespace kiln::engine
