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
static uint64_t model_key(const model::Model& m, const EngineConfig& cfg) {
  return cfg.model_key ? cfg.model_key : model_identity(m.config());
}

// A rotating cache's blocks per sequence (EngineConfig::max_kv_size): those of the first kKvKeep
// tokens, then from the window's first key (of the chunk's first token) to the chunk's end.
static int rotating_blocks(const EngineConfig& cfg) {
  const int bs = cfg.block_size, window = cfg.max_kv_size - model::kKvKeep;
  return (model::kKvKeep + bs - 1) / bs + (window - 1 + std::max(1, cfg.scheduler.max_batch_tokens)) / bs + 2;
}

static EngineConfig checked(EngineConfig cfg) {
  if (cfg.max_kv_size < 0 || (cfg.max_kv_size > 0 && cfg.max_kv_size <= model::kKvKeep))
    fail("engine", "max_kv_size is {}; it must be more than {} (the rotating cache keeps the first {} tokens and "
         "slides the rest), or 0 for off", cfg.max_kv_size, model::kKvKeep, model::kKvKeep);
  if (cfg.max_kv_size > 0 && cfg.spec.draft)
    fail("engine", "speculative decoding does not run with a rotating KV cache (max_kv_size {}); use one of them",
         cfg.max_kv_size);
  return cfg;
}

// The KV pool (kv_sizing.h): what the workload can use (explicit n_blocks, else max_seqs full
// contexts), or --kv-cache-bytes, plus the prefix cache's blocks; on a GPU capped to the
// --gpu-memory-utilization budget measured now, with the weights already on the device.
static BlockManager make_blocks(model::Model& m, const EngineConfig& cfg) {
  const model::ModelConfig& c = m.config();
  backend::Backend& be = m.backend();
  KvPoolRequest r;
  // A draft source's KV grows with the same sequences: an active block holds both, a prefix-cache
  // block only the target's.
  DraftSource* draft = cfg.spec.draft;
  r.cached_bytes_per_block = kv_bytes_per_block(m, cfg.block_size);
  r.bytes_per_block = r.cached_bytes_per_block + (draft ? draft->kv_bytes(cfg.block_size) : 0);
  const int per_seq = (c.max_position_embeddings + cfg.block_size - 1) / cfg.block_size;
  r.wanted_blocks = cfg.n_blocks > 0 ? cfg.n_blocks : per_seq * std::max(1, cfg.scheduler.max_seqs);
  if (cfg.max_kv_size > 0)  // what rotating sequences can hold at most
    r.wanted_blocks = std::min(r.wanted_blocks, rotating_blocks(cfg) * std::max(1, cfg.scheduler.max_seqs));
  r.kv_cache_bytes = cfg.kv_cache_bytes;
  r.prompt_cache_bytes = cfg.prompt_cache_bytes;
  r.gpu_memory_utilization = cfg.gpu_memory_utilization;
  if (be.device_memory(&r.device_free, &r.device_total))
    r.activation_reserve = activation_reserve_bytes(c, cfg.scheduler.max_batch_tokens, dtype_size(be.act_dtype())) +
                           (draft ? draft->activation_bytes(cfg.scheduler.max_batch_tokens) : 0);
  const KvPoolPlan plan = plan_kv_pool(r);
  if (plan.capped)
    log::info("KV cache: {} blocks ({:.2f} GB), capped by --gpu-memory-utilization {} (the workload could use {})",
              plan.active_blocks, static_cast<double>(plan.active_blocks) * r.bytes_per_block / 1e9,
              cfg.gpu_memory_utilization, r.wanted_blocks);
  if (draft) draft->reserve(plan.active_blocks, cfg.block_size);
  return BlockManager(plan.active_blocks + plan.cached_blocks, cfg.block_size,
                      PrefixCacheConfig{plan.cached_blocks, model_key(m, cfg)});
}

Engine::Engine(model::Model& model, EngineConfig cfg)
    : model_(model),
      cfg_(checked(cfg)),
      blocks_(make_blocks(model, cfg_)),
      cache_(model::KvCache::allocate(model.backend(), model.config(), blocks_.n_blocks(), cfg.block_size)),
      runner_(model, cache_, RunnerConfig{cfg.pad_decode, cfg.device_sampling}),
      scheduler_(cfg.scheduler, blocks_),
      context_length_(model.config().max_position_embeddings),
      policy_(cfg.spec.draft ? cfg.spec.num_draft_tokens : 0) {
  if (cfg_.spec.num_draft_tokens < 0 || cfg_.spec.num_draft_tokens > kMaxDraftTokens)
    fail("engine", "num_draft_tokens is {}; it must be 0..{}", cfg_.spec.num_draft_tokens, kMaxDraftTokens);
  cache_.max_kv_size = cfg_.max_kv_size;
  if (!cfg_.ssd.dir.empty()) {
    if (!blocks_.prefix_caching())
      fail("engine", "the SSD cache tier needs the prefix cache; give it room (--prompt-cache-bytes > 0)");
    // The folder's key: the hash chain's seed (the model) and the block layout (dtype, bits, shapes).
    const kvstore::KvLayout layout = kvstore::KvLayout::of(cache_);
    const uint64_t parts[2] = {model_key(model_, cfg_), layout.hash()};
    ssd_ = std::make_unique<kvstore::SsdCache>(cfg_.ssd, XXH3_64bits(parts, sizeof parts), layout,
                                               cfg_.model_name.empty() ? model_.config().dir : cfg_.model_name);
    blocks_.record_commits(true);
  }
}

Engine::~Engine() {
  if (cfg_.spec.draft)  // the source may serve a later engine, whose ids start over
    for (auto& [id, s] : seqs_) cfg_.spec.draft->forget(id);
}

int64_t Engine::add(Request r) {
  if (r.prompt.empty()) fail("engine", "the prompt is empty; give at least one token");
  if (static_cast<int>(r.prompt.size()) >= context_length_)
    fail("engine", "the prompt has {} tokens; the model's context is {} tokens", r.prompt.size(), context_length_);
  if (seq_blocks(r.prompt.size() + 1) > blocks_.n_blocks())
    fail("engine", "the prompt needs {} KV blocks but the cache has {}; raise the KV cache size",
         seq_blocks(r.prompt.size() + 1), blocks_.n_blocks());
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

int Engine::seq_blocks(int64_t n_tokens) const {
  const int all = blocks_.blocks_for(n_tokens);
  return cfg_.max_kv_size > 0 ? std::min(all, rotating_blocks(cfg_)) : all;
}

void Engine::commit_and_rotate(Sequence* s) {
  const int M = cfg_.max_kv_size;
  blocks_.commit(s->tokens, M > 0 ? std::min(s->n_computed, M) : s->n_computed, s->blocks, s->block_hashes,
                 s->n_committed_blocks);
  if (M <= 0) return;
  // The next token (position n_computed) reads keys from n_computed - (M - kKvKeep) + 1 on, besides
  // the first kKvKeep: the blocks wholly between are read by no later token.
  const int bs = blocks_.block_size();
  const int64_t first = (model::kKvKeep + bs - 1) / bs;
  const int64_t end = std::min<int64_t>((int64_t{s->n_computed} - (M - model::kKvKeep) + 1) / bs,
                                        static_cast<int64_t>(s->blocks.size()));
  for (int64_t b = first; b < end; ++b) blocks_.release_block(s->blocks, static_cast<size_t>(b));
}

void Engine::finish(Sequence* s, FinishReason r) {
  s->finish = r;
  scheduler_.remove(s);
  auto cb = std::move(s->on_event);
  int64_t id = s->id;
  seqs_.erase(id);
  if (cfg_.spec.draft) cfg_.spec.draft->forget(id);
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
  const std::vector<int32_t>& held = it->second->blocks;
  if (std::find(held.begin(), held.end(), -1) != held.end())
    fail("engine", "rollback: request {} has rotated (max_kv_size {}); the K/V before its window are gone", id,
         cfg_.max_kv_size);
  runner_.rollback(*it->second, k, blocks_);
  if (GrammarConstraint* g = it->second->grammar.get()) g->rollback(std::min<size_t>(k, g->n_tokens()));
}

// Drafts for every decoding sequence that may take some: its prompt is done and its next token
// due, no prompt logprobs are pending, and at least two tokens are left to generate (a burst never passes
// max_tokens or the context).
int Engine::propose_drafts(std::span<const ScheduledChunk> sched, std::vector<SeqChunk>& chunks,
                           std::vector<SampleSpec>& specs, std::vector<Draft>& drafts, int* batch) {
  DraftSource* src = cfg_.spec.draft;
  *batch = 0;
  if (!src || cfg_.spec.num_draft_tokens <= 0) return -1;
  auto decoding = [&](size_t i) {
    const Sequence& s = *sched[i].seq;
    return chunks[i].sample && chunks[i].n_tokens == 1 && s.n_generated() > 0 && s.num_draft_tokens != 0 &&
           !wants_prompt_logprobs(s);
  };
  int n_decoding = 0;
  for (size_t i = 0; i < sched.size(); ++i) n_decoding += decoding(i);
  *batch = n_decoding;
  if (n_decoding == 0) return -1;
  const int n_step = cfg_.spec.adaptive ? policy_.choose(n_decoding) : cfg_.spec.num_draft_tokens;
  std::vector<DraftAsk> asks;
  std::vector<size_t> where;
  for (size_t i = 0; i < sched.size() && n_step > 0; ++i) {
    if (!decoding(i)) continue;
    const Sequence& s = *sched[i].seq;
    const int L = static_cast<int>(s.tokens.size());
    int n = s.num_draft_tokens > 0 ? std::min(n_step, s.num_draft_tokens) : n_step;
    n = std::min({n, s.max_tokens - s.n_generated() - 1, context_length_ - L});
    if (n <= 0) continue;
    const bool probs = cfg_.spec.accept == SpecAccept::residual && s.sampler.params().temperature > 0.0f;
    asks.push_back({&s, n, probs, &drafts[i]});
    where.push_back(i);
  }
  if (asks.empty()) return n_step == 0 ? 0 : -1;
  src->propose(asks);
  for (size_t i : where) {
    Sequence* s = sched[i].seq;
    Draft& d = drafts[i];
    const int L = static_cast<int>(s->tokens.size());
    const int n = static_cast<int>(d.tokens.size());
    if (n == 0) continue;
    if (!blocks_.ensure(s->blocks, L + n)) {  // no room for the drafts' K/V: decode plainly
      d = {};
      continue;
    }
    s->tokens.insert(s->tokens.end(), d.tokens.begin(), d.tokens.end());
    SeqChunk& c = chunks[i];
    c.tokens = s->tokens;
    c.blocks = s->blocks;
    c.n_tokens = c.n_logits = 1 + n;
    c.verify = true;
    specs[i].context = std::span<const int32_t>(s->tokens).first(L);
    specs[i].generated = specs[i].context.subspan(s->n_prompt);
  }
  return n_step;
}

bool Engine::emit(Sequence* s, TokenEvent ev, int32_t tok) {
  ev.draft_n = s->draft_n;
  ev.draft_n_accepted = s->draft_n_accepted;
  // A token the grammar refuses (only when its state allowed none: grammar_constraint.h) is not
  // emitted; the output ends unfinished, as at max_tokens.
  if (s->grammar && !s->grammar->accept(tok)) {
    ev.finished = true;
    ev.reason = FinishReason::length;
    if (s->on_event) s->on_event(ev);
    finish(s, FinishReason::length);
    return true;
  }
  s->tokens.push_back(tok);
  ++stats_.generated_tokens;
  FinishReason r = FinishReason::none;
  // A grammar that nothing can follow any more ends the output after this token: the end comes as
  // an event of its own (no token), so the token stays text (a stop-reason token is an EOS).
  const bool grammar_done = s->grammar && s->grammar->done();
  if (std::find(s->stop_ids.begin(), s->stop_ids.end(), tok) != s->stop_ids.end()) r = FinishReason::stop;
  else if (!grammar_done && s->n_generated() >= s->max_tokens) r = FinishReason::length;
  ev.token = tok;
  ev.finished = r != FinishReason::none;
  ev.reason = r;
  if (s->on_event) s->on_event(ev);
  if (r == FinishReason::none && grammar_done) {
    r = FinishReason::stop;
    TokenEvent end = make_event(s->id, -1, true, r);
    end.draft_n = s->draft_n;
    end.draft_n_accepted = s->draft_n_accepted;
    if (s->on_event) s->on_event(end);
  }
  if (r != FinishReason::none) finish(s, r);
  return r != FinishReason::none;
}

// The chunk ran [pending, d_1..d_n] at positions L-1..L+n-1 (L: the tokens before the drafts);
// row j holds the target's logits for position L+j. Each row is processed as plain decoding would
// (penalties over the tokens before it, the accepted drafts included), then the rule decides.
int Engine::verify(Sequence* s, const Draft& d, StepOutput& out, int row) {
  const int n = static_cast<int>(d.tokens.size());
  const int L = static_cast<int>(s->tokens.size()) - n;
  std::span<const int32_t> all(s->tokens);
  Verdict v;
  KILN_ASSERT(!s->grammar || out.row_ids.empty(), "engine: a constrained verify's rows must come to the host");
  if (!out.row_ids.empty()) {
    v = accept_greedy(std::span<const int32_t>(out.row_ids).subspan(row, n + 1), d.tokens);
  } else {
    std::vector<std::vector<float>> p(n + 1);  // (greedy: one-hot at each row's argmax)
    // A grammar masks row j with its state after the drafts before it, then takes them back (the
    // emitted tokens advance it in emit()). Rows after a draft it refuses stay unmasked: that
    // draft has probability 0 under its row's mask, so no rule accepts it or reads a later row.
    GrammarConstraint* g = s->grammar.get();
    const size_t g_before = g ? g->n_tokens() : 0;
    bool g_on_path = g != nullptr;
    for (int j = 0; j <= n; ++j) {
      const std::span<const int32_t> ctx = all.first(L + j);
      if (g_on_path) {
        g->process(out.row(row + j), ctx);
        if (j < n) g_on_path = g->accept(d.tokens[j]);
      }
      s->sampler.distribution(out.row(row + j), ctx, ctx.subspan(s->n_prompt), p[j]);
    }
    if (g) g->rollback(g->n_tokens() - g_before);
    if (s->sampler.params().temperature > 0.0f) {
      v = accept_sampled(cfg_.spec.accept, p, d, s->sampler);
    } else {
      std::vector<int32_t> ids(n + 1);
      for (int j = 0; j <= n; ++j) ids[j] = argmax(p[j]);
      v = accept_greedy(ids, d.tokens);
    }
  }
  s->draft_n += n;
  stats_.draft_tokens += n;
  ++stats_.verifies;
  // K/V stand for the pending token and the accepted drafts; the blocks that hold only them may
  // enter the prefix cache (rejected positions lie past n_computed and are rewritten later).
  s->n_computed = L + v.n_accepted;
  commit_and_rotate(s);
  s->tokens.resize(L);
  cfg_.spec.draft->commit(*s, n, v.n_accepted);
  int emitted = 0;
  for (int j = 0; j < static_cast<int>(v.tokens.size()); ++j) {
    TokenEvent ev = make_event(s->id, -1, false, FinishReason::none);
    ev.n_cached = std::max(0, s->n_cached);
    ev.n_cached_ssd = std::min(ev.n_cached, s->n_cached_ssd);
    if (s->logprobs >= 0) ev.logprob = log_softmax_at(out.row(row + j), v.tokens[j], s->logprobs, &ev.top);
    if (j < v.n_accepted) ++s->draft_n_accepted, ++stats_.accepted_tokens;  // (counted as emitted: a stop ends them)
    ++emitted;
    if (emit(s, std::move(ev), v.tokens[j])) break;
  }
  return emitted;
}

int Engine::export_prefix(std::span<const int32_t> tokens, std::vector<std::byte>& data) {
  std::vector<int32_t> held;
  std::vector<uint64_t> hashes;
  const int n = blocks_.acquire_prefix(tokens, static_cast<int>(tokens.size()) / blocks_.block_size(), held, hashes,
                                       /*count=*/false);
  const std::vector<std::byte> bytes = kvstore::read_blocks(model_.backend(), cache_, held);
  data.insert(data.end(), bytes.begin(), bytes.end());
  blocks_.release(held);
  return n;
}

int Engine::import_prefix(std::span<const int32_t> tokens, int n_blocks, std::span<const std::byte> data) {
  if (cfg_.max_kv_size > 0) n_blocks = std::min(n_blocks, cfg_.max_kv_size / blocks_.block_size());
  const size_t block_bytes = kvstore::KvLayout::of(cache_).block_bytes;
  KILN_ASSERT(data.size() >= n_blocks * block_bytes);
  std::vector<std::span<const std::byte>> per_block;
  for (int i = 0; i < n_blocks; ++i) per_block.push_back(data.subspan(i * block_bytes, block_bytes));
  return adopt_blocks(tokens, 0, per_block);
}

int Engine::adopt_blocks(std::span<const int32_t> tokens, int first, std::span<const std::span<const std::byte>> data) {
  const int bs = blocks_.block_size();
  int count = static_cast<int>(data.size());
  KILN_ASSERT(static_cast<int64_t>(first + count) * bs <= static_cast<int64_t>(tokens.size()));
  // At most what the prefix cache keeps, so that adopting a later block never evicts an earlier one.
  count = std::min({count, blocks_.n_free(), blocks_.max_cached_blocks() - first});
  std::vector<uint64_t> hashes;
  std::vector<int32_t> placed;  // the cache's blocks to fill, and their bytes
  std::vector<std::span<const std::byte>> bytes;
  int i = 0;
  for (; i < count; ++i) {
    const uint64_t h = blocks_.block_hash(tokens, hashes, first + i);
    if (blocks_.is_cached(h)) continue;  // here already
    const int32_t b = blocks_.adopt(h, tokens.subspan(static_cast<size_t>(first + i) * bs, bs));
    if (b < 0) break;
    placed.push_back(b);
    bytes.push_back(data[i]);
  }
  kvstore::write_blocks(model_.backend(), cache_, placed, bytes);
  return std::max(i, 0);
}

void Engine::load_from_ssd() {
  const int bs = blocks_.block_size();
  for (Sequence* s : scheduler_.waiting()) {
    if (s->n_computed != 0 || !s->blocks.empty() || !s->reuse_prefix || s->ssd_checked == s->n_preempted) continue;
    s->ssd_checked = s->n_preempted;
    const std::span<const int32_t> tokens(s->tokens);
    // (the last token is always computed; a rotating cache's blocks past max_kv_size differ from the file's)
    int max_blocks = (static_cast<int>(tokens.size()) - 1) / bs;
    if (cfg_.max_kv_size > 0) max_blocks = std::min(max_blocks, cfg_.max_kv_size / bs);
    // The prefix the RAM cache has, held while blocks are adopted (so that none of it is evicted for them).
    std::vector<int32_t> held;
    const int i = blocks_.acquire_prefix(tokens, max_blocks, held, s->block_hashes, /*count=*/false);
    int n = 0;  // blocks [i, i + n) are on disk
    while (i + n < max_blocks && n < blocks_.n_free() && ssd_->contains(blocks_.block_hash(tokens, s->block_hashes, i + n)))
      ++n;
    // Read back in pieces of at most kSsdReadBlocks (the host holds one piece), up to the first
    // block that fails its checks or is not adopted.
    constexpr int kSsdReadBlocks = 256;
    int adopted = 0;
    for (int at = i; at < i + n;) {
      const int k = std::min(kSsdReadBlocks, i + n - at);
      const std::vector<kvstore::SsdCache::Loaded> run =
          ssd_->read_run(std::span(s->block_hashes).subspan(at, k), tokens.subspan(static_cast<size_t>(at) * bs));
      std::vector<std::span<const std::byte>> data;
      for (const kvstore::SsdCache::Loaded& l : run) data.push_back(l.payload());
      const int got = data.empty() ? 0 : adopt_blocks(tokens, at, data);
      adopted += got;
      if (got < k) break;
      at += k;
    }
    if (adopted == 0 && i < max_blocks) ssd_->note_miss();
    if (adopted > 0) s->n_cached_ssd = adopted * bs;
    blocks_.release(held);
  }
}

void Engine::save_to_ssd() {
  std::vector<int32_t> ids;
  std::vector<BlockManager::Committed> done;
  const size_t room = ssd_->queue_room();  // (blocks past it would be dropped: not downloaded either)
  int64_t over = 0;
  for (const BlockManager::Committed& c : blocks_.take_committed()) {
    if (!blocks_.is_cached(c.hash) || ssd_->contains(c.hash)) continue;
    if (done.size() == room) {
      ++over;
      continue;
    }
    done.push_back(c);
    ids.push_back(c.block);
  }
  ssd_->note_dropped(over);
  if (ids.empty()) return;
  // The copies run behind the next steps; the SSD writer waits for them, this thread does not.
  const std::shared_ptr<const kvstore::BlockDownload> d = kvstore::start_read_blocks(model_.backend(), cache_, ids);
  for (size_t i = 0; i < done.size(); ++i) ssd_->write(done[i].hash, blocks_.block_tokens(done[i].block), d, i);
}

int Engine::step() {
  if (ssd_) load_from_ssd();
  auto sched = scheduler_.schedule();
  if (sched.empty()) return 0;
  auto t0 = std::chrono::steady_clock::now();

  // Each scheduled chunk as the runner's: which rows need logits (every position for prompt
  // logprobs, else the last when a token is due) and how its token is sampled.
  std::vector<SeqChunk> chunks(sched.size());
  std::vector<SampleSpec> specs(sched.size());
  bool any_prefill = false;
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
      specs[i] = {&s->sampler, s->tokens, std::span<const int32_t>(s->tokens).subspan(s->n_prompt), s->processors,
                  s->logprobs >= 0};
      c.sample = &specs[i];
    }
    any_prefill |= c.n_tokens > 1 || s->n_computed < s->n_prompt;
  }
  std::vector<Draft> drafts(sched.size());
  int n_drafting = 0;  // the sequences the policy's choice went to
  const int n_draft = propose_drafts(sched, chunks, specs, drafts, &n_drafting);
  int n_tokens = 0;
  for (const SeqChunk& c : chunks) n_tokens += c.n_tokens;
  StepOutput out = runner_.run(chunks);

  int emitted = 0;
  std::vector<const Sequence*> prefilled;  // prompts done this step: the draft source prefills them
  for (size_t ci = 0; ci < sched.size(); ++ci) {
    const ScheduledChunk& c = sched[ci];
    Sequence* s = c.seq;
    const int row = out.first_row[ci];
    if (!drafts[ci].tokens.empty()) {
      emitted += verify(s, drafts[ci], out, row);
      continue;
    }
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
    const bool prompt_chunk = s->n_computed < s->n_prompt;
    if (prompt_chunk) stats_.prompt_tokens += std::min(c.n_tokens, s->n_prompt - s->n_computed);
    s->n_computed += c.n_tokens;
    commit_and_rotate(s);
    if (!c.wants_logits) continue;
    TokenEvent ev = make_event(s->id, -1, false, FinishReason::none);
    ev.n_cached = std::max(0, s->n_cached);
    ev.n_cached_ssd = std::min(ev.n_cached, s->n_cached_ssd);
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
    ++emitted;
    const bool done = emit(s, std::move(ev), tok);
    if (!done && prompt_chunk && cfg_.spec.draft && s->num_draft_tokens != 0) prefilled.push_back(s);
  }
  if (!prefilled.empty()) cfg_.spec.draft->prefill(prefilled);
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (any_prefill ? stats_.prefill_seconds : stats_.decode_seconds) += dt;
  if (!any_prefill && n_draft >= 0 && cfg_.spec.adaptive) policy_.record(n_drafting, n_draft, emitted, dt);
  ++stats_.steps;
  if (ssd_) save_to_ssd();
  return n_tokens;
}

}  // namespace kiln::engine
