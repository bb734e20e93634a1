// Engine::step: schedule -> build the ragged Batch -> forward -> sample -> report.
#include "kiln/engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>

namespace kiln::engine {

static int derive_n_blocks(const model::ModelConfig& c, const EngineConfig& cfg, int context) {
  if (cfg.n_blocks > 0) return cfg.n_blocks;
  size_t per_block = 2ull * c.n_layers * cfg.block_size * c.n_kv_heads * c.head_dim * 4;  // K and V, f32 worst case
  if (cfg.kv_cache_bytes > 0) return std::max<int>(1, static_cast<int>(cfg.kv_cache_bytes / per_block));
  int per_seq = (context + cfg.block_size - 1) / cfg.block_size;
  return per_seq * std::max(1, cfg.scheduler.max_seqs);
}

// The prefix cache's blocks: --prompt-cache-bytes of KV at the same f32 worst case, at most 4x
// the active pool (a tiny model would otherwise allocate gigabytes it can never fill usefully).
static int derive_cache_blocks(const model::ModelConfig& c, const EngineConfig& cfg, int active) {
  if (cfg.prompt_cache_bytes == 0) return 0;
  size_t per_block = 2ull * c.n_layers * cfg.block_size * c.n_kv_heads * c.head_dim * 4;
  return static_cast<int>(std::min<size_t>(cfg.prompt_cache_bytes / per_block, 4ull * active));
}

static BlockManager make_blocks(const model::ModelConfig& c, const EngineConfig& cfg) {
  int active = derive_n_blocks(c, cfg, c.max_position_embeddings);
  int cached = derive_cache_blocks(c, cfg, active);
  return BlockManager(active + cached, cfg.block_size, PrefixCacheConfig{cached, cfg.model_key});
}

Engine::Engine(model::Model& model, EngineConfig cfg)
    : model_(model),
      cfg_(cfg),
      blocks_(make_blocks(model.config(), cfg)),
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
  Tensor logits = model_.forward(b, cache_);  // [n_out, vocab] host f32 (greedy_only: i32 ids [n_out])
  const int32_t* greedy_ids = b.greedy_only ? logits.ptr<int32_t>() : nullptr;
  const int64_t vocab = b.greedy_only ? 0 : logits.dim(1);

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
  return b.n_tokens();
}

}  // namespace kiln::engine
