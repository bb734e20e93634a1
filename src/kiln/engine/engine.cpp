// Engine::step: schedule -> the runner (batch, forward, sampling) -> report each sequence's token.
#include "kiln/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <span>

#include <xxhash.h>

#include "kiln/base/log.h"
#include "kiln/engine/kv_sizing.h"

namespace kiln::engine {

// The prefix cache's default key: the model's identity (its folder and whole config.json), so no
// cache is ever matched against another model's tokens.
static uint64_t model_identity(const model::ModelConfig& c) {
  const std::string id = c.dir + "\n" + c.raw.dump();
  return XXH3_64bits(id.data(), id.size());
}

// The KV pool (kv_sizing.h): what the workload can use (explicit n_blocks, else max_seqs full
// contexts), or --kv-cache-bytes, plus the prefix cache's blocks; on a GPU capped to the
// --gpu-memory-utilization budget measured now, with the weights already on the device.
static BlockManager make_blocks(model::Model& m, const EngineConfig& cfg) {
  const model::ModelConfig& c = m.config();
  backend::Backend& be = m.backend();
  KvPoolRequest r;
  r.bytes_per_block = kv_bytes_per_block(m, cfg.block_size);
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
                      PrefixCacheConfig{plan.cached_blocks, cfg.model_key ? cfg.model_key : model_identity(c)});
}

Engine::Engine(model::Model& model, EngineConfig cfg)
    : model_(model),
      cfg_(cfg),
      blocks_(make_blocks(model, cfg)),
      cache_(model::KvCache::allocate(model.backend(), model.config(), blocks_.n_blocks(), cfg.block_size)),
      runner_(model, cache_, RunnerConfig{cfg.pad_decode, cfg.device_sampling}),
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

void Engine::rollback(int64_t id, int k) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) fail("engine", "rollback: no request {}", id);
  runner_.rollback(*it->second, k, blocks_);
}

int Engine::step() {
  auto sched = scheduler_.schedule();
  if (sched.empty()) return 0;
  auto t0 = std::chrono::steady_clock::now();

  // Each scheduled chunk as the runner's: which rows need logits (every position for prompt
  // logprobs, else the last when a token is due) and how its token is sampled.
  std::vector<SeqChunk> chunks(sched.size());
  std::vector<SampleSpec> specs(sched.size());
  bool any_prefill = false;
  int n_tokens = 0;
  for (size_t i = 0; i < sched.size(); ++i) {
    Sequence* s = sched[i].seq;
    SeqChunk& c = chunks[i];
    c.tokens = s->tokens;
    c.start = s->n_computed;
    c.n_tokens = sched[i].n_tokens;
    c.blocks = s->blocks;
    const bool samples = sched[i].wants_logits && s->max_tokens > 0;
    c.n_logits = wants_prompt_logprobs(*s) ? c.n_tokens : samples ? 1 : 0;
    if (samples) {
      specs[i] = {&s->sampler, s->tokens, std::span<const int32_t>(s->tokens).subspan(s->n_prompt), {}, s->logprobs >= 0};
      c.sample = &specs[i];
    }
    any_prefill |= c.n_tokens > 1 || s->n_computed < s->n_prompt;
    n_tokens += c.n_tokens;
  }
  StepOutput out = runner_.run(chunks);

  for (size_t ci = 0; ci < sched.size(); ++ci) {
    const ScheduledChunk& c = sched[ci];
    Sequence* s = c.seq;
    const int row = out.first_row[ci];
    if (wants_prompt_logprobs(*s)) {
      for (int j = 0; j < c.n_tokens; ++j) {
        int pos = s->n_computed + j;
        if (pos + 1 >= s->n_prompt) break;
        auto& e = s->prompt_lp[pos + 1];
        e.assign(1, {s->tokens[pos + 1], 0.0f});
        std::vector<TokenLogprob> top;
        e[0].logprob = log_softmax_at(out.row(row + j), s->tokens[pos + 1], s->prompt_logprobs, &top);
        e.insert(e.end(), top.begin(), top.end());
      }
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
    const int32_t tok = out.tokens[ci];
    // The processed logits of the sampled row (after bias and penalties), as OpenAI reports them.
    if (s->logprobs >= 0) ev.logprob = log_softmax_at(out.row(row + chunks[ci].n_logits - 1), tok, s->logprobs, &ev.top);
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
  return n_tokens;
}

}  // namespace kiln::engine
