// The KV block pool: hands out fixed-size blocks of the paged cache and takes them back, and
// keeps the prefix cache: full blocks stay after their sequence ends, keyed by the hash chain of
// their tokens (seeded with the model's key), reference-counted so sequences share them, and
// evicted least-recently-used. No tensor work here; the KvCache holds the memory.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::engine {

struct PrefixCacheConfig {
  int max_cached_blocks = 0;  // unreferenced blocks kept for reuse; 0 turns the prefix cache off
  uint64_t model_key = 0;     // seeds the hash chain, so caches of different models never match
};

class BlockManager {
 public:
  BlockManager(int n_blocks, int block_size, PrefixCacheConfig cache = {});
  int block_size() const { return block_size_; }
  int n_blocks() const { return n_blocks_; }
  // Blocks that can be handed out: empty ones plus cached ones nobody references (evictable).
  int n_free() const { return static_cast<int>(free_.size() + lru_.size()); }
  // Blocks referenced by at least one sequence.
  int n_used() const { return n_blocks_ - n_free(); }
  // Unreferenced blocks that still hold a cached prefix.
  int n_cached() const { return static_cast<int>(lru_.size()); }
  bool prefix_caching() const { return cache_.max_cached_blocks > 0; }
  int max_cached_blocks() const { return cache_.max_cached_blocks; }
  // Blocks needed to hold n_tokens.
  int blocks_for(int64_t n_tokens) const { return static_cast<int>((n_tokens + block_size_ - 1) / block_size_); }
  // Grows `blocks` to hold n_tokens; false (and no change) when the pool lacks blocks.
  // Takes empty blocks first, then evicts the least recently used cached ones.
  bool ensure(std::vector<int32_t>& blocks, int64_t n_tokens);
  // Drops one reference on every block in `blocks` (last first, so a chain's head is evicted last)
  // and clears it. Blocks nobody references go back to the pool; hashed ones stay cached.
  void release(std::vector<int32_t>& blocks);
  // Drops the reference on blocks[i] alone and leaves -1 in its place (the rotating cache: a block
  // between the kept first tokens and the window, which no later token reads). release(),
  // truncate() and commit() skip such entries.
  void release_block(std::vector<int32_t>& blocks, size_t i);
  // Cuts `blocks` to hold n_tokens (a roll-back): the blocks past them are released and leave the
  // prefix cache where only this sequence held them (their tokens were rolled back). The block that
  // keeps part of its tokens (n_tokens % block_size rows) leaves the prefix cache too, since its
  // later rows will be rewritten; if another sequence shares it, it is replaced by a fresh block
  // and the shared one is returned for the caller to copy into the new one (else -1). `hashes` and
  // `n_committed` (the caller's memos) are cut to the blocks still full.
  int32_t truncate(std::vector<int32_t>& blocks, int64_t n_tokens, std::vector<uint64_t>& hashes, int& n_committed);

  // Prefix cache. `hashes` is the caller's memo of the chain hashes of its full blocks
  // (hashes[i] covers tokens [0, (i+1) * block_size)); these calls extend it as needed.
  // Appends the longest run of cached blocks matching tokens' full blocks (at most max_blocks)
  // to the empty `blocks`, taking a reference on each; returns how many. `count`: add to the
  // hit/lookup counters (a lookup that serves a request, not the engine's own bookkeeping).
  int acquire_prefix(std::span<const int32_t> tokens, int max_blocks, std::vector<int32_t>& blocks,
                     std::vector<uint64_t>& hashes, bool count = true);
  // Registers the full blocks among tokens[0, n_computed) (their K/V are written) so later
  // sequences can reuse them; `n_committed` (the caller's memo) skips blocks done before.
  void commit(std::span<const int32_t> tokens, int n_computed, const std::vector<int32_t>& blocks,
              std::vector<uint64_t>& hashes, int& n_committed);
  // The chain hash of tokens' block i (extending the memo `hashes` as needed).
  uint64_t block_hash(std::span<const int32_t> tokens, std::vector<uint64_t>& hashes, int i) const {
    return chain_hash(tokens, hashes, i);
  }
  bool is_cached(uint64_t hash) const { return by_hash_.count(hash) != 0; }
  // A prefix-cache entry whose K/V come from elsewhere (a file): takes a block (an empty one, else
  // the least recently used cached one), registers it under `hash` with its tokens, unreferenced and
  // most recently used, and returns it for the caller to fill; -1 when none can be taken.
  int32_t adopt(uint64_t hash, std::span<const int32_t> block_tokens);
  // Blocks commit() has registered since the last call, when recording is on (the SSD tier writes
  // them out). Their K/V are complete and stay as they are while they are cached.
  struct Committed {
    uint64_t hash;
    int32_t block;
  };
  void record_commits(bool on) { record_ = on; }
  std::vector<Committed> take_committed() { return std::exchange(committed_, {}); }
  const std::vector<int32_t>& block_tokens(int32_t b) const { return info_[b].tokens; }

  // Counters for /metrics: tokens served from the cache, and lookups made.
  int64_t hit_tokens() const { return hit_tokens_; }
  int64_t lookups() const { return lookups_; }
  int64_t evictions() const { return evictions_; }

 private:
  struct Info {
    int ref = 0;
    bool hashed = false;
    uint64_t hash = 0;
    std::vector<int32_t> tokens;        // [block_size] the block's tokens, to rule out hash collisions
    std::list<int32_t>::iterator lru;   // valid while ref == 0 and hashed
  };
  uint64_t chain_hash(std::span<const int32_t> tokens, std::vector<uint64_t>& hashes, int i) const;
  int32_t take_block();   // an empty block, or the LRU cached one evicted; requires n_free() > 0
  // Drops one reference; an unreferenced block is cached (hashed, unless `forget`) or freed.
  void drop_ref(int32_t b, bool forget);
  void trim_cache();      // the least recently used cached blocks past the cache's size become free
  void unhash(int32_t b);

  int n_blocks_, block_size_;
  PrefixCacheConfig cache_;
  std::vector<Info> info_;                        // [n_blocks]
  std::vector<int32_t> free_;                     // empty blocks, a stack (recently freed reused first)
  std::list<int32_t> lru_;                        // cached unreferenced blocks, least recent first
  std::unordered_map<uint64_t, int32_t> by_hash_; // chain hash -> block
  bool record_ = false;
  std::vector<Committed> committed_;
  int64_t hit_tokens_ = 0, lookups_ = 0, evictions_ = 0;
};

}  // namespace kiln::engine
