// Engine::step: schedule -> build the ragged Batch -> forward -> sample -> report.
#include "kiln/engine/engine.h"

#include <algorithm>
#include <chrono>

namespace kiln::engine {

static int derive_n_blocks(const model::ModelConfig& c, const EngineConfig& cfg, int context) {
  if (cfg.n_blocks > 0) return cfg.n_blocks;
  size_t per_block = 2ull * c.n_layers * cfg.block_size * c.n_kv_heads * c.head_dim * 4;  // K and V, f32 worst case
  if (cfg.kv_cache_bytes > 0) return std::max<int>(1, static_cast<int>(cfg.kv_cache_bytes / per_block));
  int per_seq = (context + cfg.block_size - 1) / cfg.block_size;
  return per_seq * std::max(1, cfg.scheduler.max_seqs);
}

Engine::Engine(model::Model& model, EngineConfig cfg)
    : model_(model),
      cfg_(cfg),
      blocks_(derive_n_blocks(model.config(), cfg, model.config().max_position_embeddings), cfg.block_size),
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
  if (cb && r == FinishReason::cancelled) cb(TokenEvent{id, -1, true, r, {}});
}

void Engine::cancel(int64_t id) {
  auto it = seqs_.find(id);
  if (it != seqs_.end()) finish(it->second.get(), FinishReason::cancelled);
}

int Engine::step() {
  auto chunks = scheduler_.schedule();
  if (chunks.empty()) return 0;
  auto t0 = std::chrono::steady_clock::now();

  // Build the ragged batch: each chunk's tokens, positions, KV slots and block table.
  model::Batch b;
  b.n_seqs = static_cast<int>(chunks.size());
  for (auto& c : chunks) b.max_blocks = std::max(b.max_blocks, static_cast<int>(c.seq->blocks.size()));
  b.block_tables.assign(static_cast<size_t>(b.n_seqs) * b.max_blocks, 0);
  bool any_prefill = false;
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
    if (chunks[i].wants_logits) b.logit_rows.push_back(b.n_tokens() - 1);
    any_prefill |= chunks[i].n_tokens > 1 || s->n_computed < s->n_prompt;
  }

  Tensor logits = model_.forward(b, cache_);  // [n_out, vocab] host f32
  const int64_t vocab = logits.dim(1);

  int row = 0;
  for (auto& c : chunks) {
    Sequence* s = c.seq;
    if (s->n_computed < s->n_prompt) stats_.prompt_tokens += std::min(c.n_tokens, s->n_prompt - s->n_computed);
    s->n_computed += c.n_tokens;
    if (!c.wants_logits) continue;
    std::span<float> l(logits.ptr<float>() + row * vocab, vocab);
    ++row;
    std::span<const int32_t> gen(s->tokens.data() + s->n_prompt, s->n_generated());
    int32_t tok = s->sampler.sample(l, s->tokens, gen);
    s->tokens.push_back(tok);
    ++stats_.generated_tokens;
    FinishReason r = FinishReason::none;
    if (std::find(s->stop_ids.begin(), s->stop_ids.end(), tok) != s->stop_ids.end()) r = FinishReason::stop;
    else if (s->n_generated() >= s->max_tokens) r = FinishReason::length;
    if (s->on_event) s->on_event(TokenEvent{s->id, tok, r != FinishReason::none, r, {}});
    if (r != FinishReason::none) finish(s, r);
  }
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (any_prefill ? stats_.prefill_seconds : stats_.decode_seconds) += dt;
  ++stats_.steps;
  return b.n_tokens();
}

}  // namespace kiln::engine
