// The engine: owns the model's KV cache, the block pool and the scheduler; step() runs one
// batched forward over every scheduled sequence, samples, and reports tokens through each
// request's callback. One thread drives it (the server's engine thread, or `kiln generate`).
#pragma once
#include <map>
#include <memory>
#include <span>

#include "kiln/engine/block_manager.h"
#include "kiln/engine/model_runner.h"
#include "kiln/engine/scheduler.h"
#include "kiln/engine/speculative.h"
#include "kiln/kvstore/ssd_cache.h"
#include "kiln/model/model.h"

namespace kiln::engine {

// Speculative decoding (speculative.h): a draft source proposes tokens for decoding sequences and
// each step verifies them in the same batch.
struct SpecConfig {
  DraftSource* draft = nullptr;  // null: off. Not owned; outlives the engine.
  int num_draft_tokens = 3;      // at most this many per sequence and step (Request::num_draft_tokens lowers it)
  SpecAccept accept = SpecAccept::residual;
  bool adaptive = true;          // SpecPolicy picks 0..num_draft_tokens per step; false: always the most
};

struct EngineConfig {
  SchedulerConfig scheduler;
  int block_size = 16;
  int n_blocks = 0;          // 0: derived from kv_cache_bytes
  size_t kv_cache_bytes = 0; // 0: enough for max_seqs sequences of the full context
  // Prefix cache: KV kept for reuse after requests end, in extra blocks beside the ones above
  // (at most 4x as many). 0 turns it off.
  size_t prompt_cache_bytes = 0;
  uint64_t model_key = 0;    // seeds the prefix cache's hash chain (see BlockManager); 0: model_identity()
  // Sequences without logprobs sample on the device where the backend can (RunnerConfig).
  bool device_sampling = true;
  // GPU: the fraction of the device's total memory the process may use (weights, activations
  // and the KV pool, which is capped to fit); 0 = no device budget. kv_cache_bytes overrides it.
  double gpu_memory_utilization = 0.0;
  // Decode-only batches padded to graph buckets (RunnerConfig). Default: where the backend has graphs.
  using PadDecode = RunnerConfig::PadDecode;
  PadDecode pad_decode = PadDecode::automatic;
  SpecConfig spec;
  // The rotating KV cache (mlx-lm's --max-kv-size; model::KvCache::max_kv_size): > kKvKeep, each
  // token attends to the first kKvKeep tokens and the last max_kv_size - kKvKeep, and a sequence
  // gives back the blocks between them, so a long generation holds about max_kv_size / block_size
  // + 3 blocks (a prefill chunk of up to max_batch_tokens more while it runs). Blocks with tokens
  // past max_kv_size never enter the prefix cache (their K/V differ from a plain run's), so neither
  // the SSD tier nor prompt files get them. Not with speculative decoding. 0: off.
  int max_kv_size = 0;
  // The SSD tier of the prefix cache (kvstore/ssd_cache.h): full blocks are written there as they
  // complete, and a prefix that continues on disk is read back instead of recomputed. Needs the
  // prefix cache (prompt_cache_bytes > 0). `model_name` labels its folder.
  kvstore::SsdConfig ssd;
  std::string model_name;
};

struct EngineStats {
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // steps that ran any prefill / only decodes
  // Speculative decoding: tokens proposed and accepted, and verifies (one per sequence and step
  // with a draft; each emits its accepted tokens plus one).
  int64_t draft_tokens = 0, accepted_tokens = 0, verifies = 0;
};

class Engine {
 public:
  Engine(model::Model& model, EngineConfig cfg);
  ~Engine();
  // Queues a request; returns its id. Prompts longer than the context fail with kiln::Error.
  int64_t add(Request r);
  // Drops a request at once and frees its blocks; its callback gets a final `cancelled` event.
  void cancel(int64_t id);
  // Ends every request with an `error` event carrying `message` (after a failed forward).
  void abort_all(const std::string& message);
  bool has_work() const { return !scheduler_.empty(); }
  // Drops the last k generated tokens of a request (ModelRunner::rollback): generation goes on from
  // the token before them, and the prefix cache never serves their K/V.
  void rollback(int64_t id, int k);
  // Runs one batched forward; returns the number of tokens it computed.
  int step();

  // Prompt cache files (kvstore/prompt_file.h). The K/V of the longest run of tokens' full blocks
  // that the prefix cache holds, [n][KvLayout::block_bytes] appended to `data`; returns n.
  int export_prefix(std::span<const int32_t> tokens, std::vector<std::byte>& data);
  // Puts the K/V of tokens' first n_blocks full blocks (data as export_prefix gives) into the
  // prefix cache, so that a request starting with those tokens computes only what follows; returns
  // how many blocks the cache took (it may have room for fewer).
  int import_prefix(std::span<const int32_t> tokens, int n_blocks, std::span<const std::byte> data);
  const model::KvCache& kv_cache() const { return cache_; }
  // The SSD tier, or null when off.
  kvstore::SsdCache* ssd() const { return ssd_.get(); }

  const EngineStats& stats() const { return stats_; }
  const BlockManager& blocks() const { return blocks_; }
  const Scheduler& scheduler() const { return scheduler_; }
  model::Model& model() { return model_; }
  int context_length() const { return context_length_; }

 private:
  void finish(Sequence* s, FinishReason r);
  // After s's K/V reach n_computed: its full blocks within the prefix cache's reach (all, or with a
  // rotating cache those before max_kv_size) are registered, and with a rotating cache the blocks no
  // later token reads are given back.
  void commit_and_rotate(Sequence* s);
  // The most blocks a sequence of n_tokens holds at once.
  int seq_blocks(int64_t n_tokens) const;
  // Appends drafts to the decoding chunks' sequences and widens those chunks into verifies; returns
  // the draft length asked for (-1: none asked) and sets *batch to the sequences it could go to.
  int propose_drafts(std::span<const ScheduledChunk> sched, std::vector<SeqChunk>& chunks, std::vector<SampleSpec>& specs,
                     std::vector<Draft>& drafts, int* batch);
  // The accepted drafts and one more token from a verify's rows; returns the tokens emitted.
  int verify(Sequence* s, const Draft& d, StepOutput& out, int row);
  // Appends tok to s and reports it; true when s finished (and is gone).
  bool emit(Sequence* s, TokenEvent ev, int32_t tok);
  // The SSD tier: before scheduling, waiting sequences' prefixes that continue on disk are read
  // into the prefix cache; after a step, the blocks it completed are queued for writing.
  void load_from_ssd();
  // Adopts tokens' full blocks [first, first + data.size()) into the prefix cache with their K/V
  // (data[i]: block first + i's bytes); returns how many of them the cache holds after.
  int adopt_blocks(std::span<const int32_t> tokens, int first, std::span<const std::span<const std::byte>> data);
  void save_to_ssd();

  model::Model& model_;
  EngineConfig cfg_;
  BlockManager blocks_;
  model::KvCache cache_;
  ModelRunner runner_;
  Scheduler scheduler_;
  std::map<int64_t, std::unique_ptr<Sequence>> seqs_;
  int64_t next_id_ = 1;
  int context_length_;
  EngineStats stats_;
  SpecPolicy policy_;
  std::unique_ptr<kvstore::SsdCache> ssd_;
};

}  // namespace kiln::engine
