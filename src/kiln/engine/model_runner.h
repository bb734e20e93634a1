// The device side of one engine step: the ragged Batch built from each sequence's chunk (token ids,
// positions, KV slots, block tables, which positions need logits: any number per sequence), its
// upload, decode batches padded to graph buckets, graph capture/replay around the model's forward,
// and the sampling stage (the device's argmax or sampler, or the host Sampler after per-sequence
// logits processors). It also rolls a sequence back by k tokens (speculative decoding's rejects).
// Every caller of Model::forward goes through it: the engine, perplexity, tests and benches.
#pragma once
#include <span>
#include <vector>

#include "kiln/engine/block_manager.h"
#include "kiln/engine/sampler.h"
#include "kiln/model/model.h"

namespace kiln::engine {

struct Sequence;

// A per-sequence logits processor: changes the logits of the row about to be sampled, before the
// sampler's own bias and penalties. Sequences with processors sample on the host, except where
// every processor is a token mask (a grammar's) and the backend samples on the device: the masks
// are computed on the host's threads while the forward runs, and applied on the device.
class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  // logits [vocab]; context: the sequence's tokens so far (prompt and output).
  virtual void process(std::span<float> logits, std::span<const int32_t> context) = 0;
  // Whether process() only sets logits to -inf (a token mask), so that mask() may stand for it.
  virtual bool is_mask() const { return false; }
  // The tokens process() would keep: bit t of words [ceil(vocab / 32)] set (others cleared).
  virtual void mask(std::span<uint32_t> words) { (void)words; }
};

// How the token after a chunk is chosen (from the chunk's last logits row).
struct SampleSpec {
  Sampler* sampler = nullptr;
  std::span<const int32_t> context;    // prompt and tokens so far (repetition penalty, processors)
  std::span<const int32_t> generated;  // the output tokens only (presence/frequency penalties)
  std::span<LogitsProcessor* const> processors;
  bool keep_logits = false;            // the processed row is read back (logprobs)
};

// One sequence's part of a step: positions [start, start + n_tokens) of `tokens` run; the K/V of
// the positions before start are in the cache already.
struct SeqChunk {
  std::span<const int32_t> tokens;
  int start = 0, n_tokens = 0;
  std::span<const int32_t> blocks;     // its KV block table, covering start + n_tokens positions
  int n_logits = 0;                    // logits of the chunk's last n_logits positions (0..n_tokens)
  const SampleSpec* sample = nullptr;  // draw a token from the last of them (needs n_logits >= 1)
  // Speculative verify: every logits row is a position the engine chooses a token for itself (from
  // the rows, or StepOutput::row_ids where the device took the argmax); the runner samples none.
  bool verify = false;
};

struct StepOutput {
  // Host f32 [rows, vocab], the chunks' rows in order; empty when every token was chosen on the
  // device (only the ids came back).
  Tensor logits;
  std::vector<int> first_row;   // [n_chunks] the chunk's first row in logits
  std::vector<int32_t> tokens;  // [n_chunks] the sampled token, -1 where the chunk samples none
  std::vector<int32_t> row_ids; // [rows] the device's pick of every row, when the device picked them
  std::span<float> row(int r) const {
    const int64_t v = logits.dim(1);
    return {logits.ptr<float>() + r * v, static_cast<size_t>(v)};
  }
};

struct RunnerConfig {
  // Decode-only batches padded to a bucket (1, 2, 4, then multiples of 8) with inert rows, so that
  // graphs are captured per bucket rather than per batch size. automatic: where caps().graphs.
  enum class PadDecode { automatic, on, off } pad_decode = PadDecode::automatic;
  // Where caps().device_sampling: sequences without logprobs or processors sample on the device
  // (only token ids are downloaded); false keeps sampled (temperature > 0) rows on the host Sampler.
  // Greedy rows take the device argmax either way.
  bool device_sampling = true;
};

class ModelRunner {
 public:
  // Steps where every chunk runs the same q <= this many tokens, all with logits (decodes, verifies
  // of up to 16 drafts), are padded to graph buckets and replayed as graphs.
  static constexpr int kMaxUniformTokens = 17;
  ModelRunner(model::Model& m, model::KvCache& cache, RunnerConfig cfg = {});
  int block_size() const { return cache_.block_size; }
  // One step over the chunks (at least one token in all); K/V of every run position are written.
  StepOutput run(std::span<const SeqChunk> chunks);
  // Host logits f32 [rows, vocab] of the chunks' requested rows (no sampling).
  Tensor logits(std::span<const SeqChunk> chunks) { return run(chunks).logits; }

  // Drops the last k tokens of s (k <= its tokens): their K/V are forgotten and the blocks past the
  // new end go back to `blocks`; the block that keeps part of its tokens leaves the prefix cache
  // (its rows after the end will be rewritten), or when another sequence shares it, s continues in
  // a copy of it. Rolled-back tokens are never served by the prefix cache.
  void rollback(Sequence& s, int k, BlockManager& blocks);

 private:
  model::Model& model_;
  model::KvCache& cache_;
  RunnerConfig cfg_;
};

}  // namespace kiln::engine
