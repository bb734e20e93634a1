// BlockManager: a free stack of empty blocks, an LRU list of cached unreferenced blocks, and a
// hash table from chain hash to block. Hash of block i = XXH3-64(tokens of block i, seed = hash of
// block i-1, or the model key for block 0): equal hashes mean equal whole prefixes.
#include "kiln/engine/block_manager.h"

#include <xxhash.h>

#include <algorithm>

#include "kiln/base/error.h"

namespace kiln::engine {

BlockManager::BlockManager(int n_blocks, int block_size, PrefixCacheConfig cache)
    : n_blocks_(n_blocks), block_size_(block_size), cache_(cache), info_(n_blocks) {
  KILN_ASSERT(n_blocks > 0 && block_size > 0);
  free_.reserve(n_blocks);
  for (int i = n_blocks - 1; i >= 0; --i) free_.push_back(i);
}

void BlockManager::unhash(int32_t b) {
  Info& in = info_[b];
  if (!in.hashed) return;
  auto it = by_hash_.find(in.hash);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  in.hashed = false;
  in.tokens.clear();
}

int32_t BlockManager::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    KILN_ASSERT(!lru_.empty());
    b = lru_.front();  // evict the least recently used cached block
    lru_.pop_front();
    unhash(b);
    ++evictions_;
  }
  info_[b].ref = 1;
  return b;
}

bool BlockManager::ensure(std::vector<int32_t>& blocks, int64_t n_tokens) {
  int need = blocks_for(n_tokens) - static_cast<int>(blocks.size());
  if (need <= 0) return true;
  if (need > n_free()) return false;
  for (int i = 0; i < need; ++i) blocks.push_back(take_block());
  return true;
}

void BlockManager::drop_ref(int32_t b, bool forget) {
  Info& in = info_[b];
  KILN_ASSERT(in.ref > 0);
  if (--in.ref > 0) return;  // still shared with another sequence
  if (in.hashed && prefix_caching() && !forget) {
    lru_.push_back(b);
    in.lru = std::prev(lru_.end());
  } else {
    unhash(b);
    free_.push_back(b);
  }
}

void BlockManager::trim_cache() {
  while (static_cast<int>(lru_.size()) > cache_.max_cached_blocks) {
    int32_t b = lru_.front();
    lru_.pop_front();
    unhash(b);
    free_.push_back(b);
    ++evictions_;
  }
}

void BlockManager::release(std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)
    if (*it >= 0) drop_ref(*it, false);
  blocks.clear();
  trim_cache();  // keep the cache under its size
}

void BlockManager::release_block(std::vector<int32_t>& blocks, size_t i) {
  if (blocks[i] < 0) return;
  drop_ref(blocks[i], false);
  blocks[i] = -1;
  trim_cache();
}

int32_t BlockManager::truncate(std::vector<int32_t>& blocks, int64_t n_tokens, std::vector<uint64_t>& hashes,
                               int& n_committed) {
  const int keep = blocks_for(n_tokens), full = static_cast<int>(n_tokens / block_size_);
  while (static_cast<int>(blocks.size()) > keep) {
    if (blocks.back() >= 0) drop_ref(blocks.back(), /*forget=*/info_[blocks.back()].ref == 1);
    blocks.pop_back();
  }
  int32_t shared = -1;
  if (keep > full && full < static_cast<int>(blocks.size()) && blocks[full] >= 0) {  // the partly kept block
    int32_t& b = blocks[full];
    if (info_[b].ref > 1) {
      if (n_free() == 0) fail("engine", "rollback: no free KV block to copy a shared block into; raise the KV cache size");
      shared = b;
      drop_ref(b, false);
      b = take_block();
    } else {
      unhash(b);
    }
  }
  hashes.resize(std::min<size_t>(hashes.size(), full));
  n_committed = std::min(n_committed, full);
  return shared;
}

int32_t BlockManager::adopt(uint64_t hash, std::span<const int32_t> block_tokens) {
  KILN_ASSERT(block_tokens.size() == static_cast<size_t>(block_size_));
  if (!prefix_caching() || n_free() == 0 || by_hash_.count(hash)) return -1;
  const int32_t b = take_block();
  Info& in = info_[b];
  in.ref = 0;
  in.hashed = true;
  in.hash = hash;
  in.tokens.assign(block_tokens.begin(), block_tokens.end());
  by_hash_.emplace(hash, b);
  lru_.push_back(b);
  in.lru = std::prev(lru_.end());
  return b;
}

uint64_t BlockManager::chain_hash(std::span<const int32_t> tokens, std::vector<uint64_t>& hashes, int i) const {
  while (static_cast<int>(hashes.size()) <= i) {
    size_t j = hashes.size();
    uint64_t seed = j == 0 ? cache_.model_key : hashes[j - 1];
    hashes.push_back(XXH3_64bits_withSeed(tokens.data() + j * block_size_, sizeof(int32_t) * block_size_, seed));
  }
  return hashes[i];
}

int BlockManager::acquire_prefix(std::span<const int32_t> tokens, int max_blocks, std::vector<int32_t>& blocks,
                                 std::vector<uint64_t>& hashes, bool count) {
  KILN_ASSERT(blocks.empty());
  if (!prefix_caching()) return 0;
  lookups_ += count;
  max_blocks = std::min<int>(max_blocks, static_cast<int>(tokens.size()) / block_size_);
  for (int i = 0; i < max_blocks; ++i) {
    auto it = by_hash_.find(chain_hash(tokens, hashes, i));
    if (it == by_hash_.end()) break;
    Info& in = info_[it->second];
    if (!std::equal(in.tokens.begin(), in.tokens.end(), tokens.begin() + static_cast<size_t>(i) * block_size_)) break;
    if (in.ref++ == 0) lru_.erase(in.lru);  // no longer evictable
    blocks.push_back(it->second);
  }
  if (count) hit_tokens_ += static_cast<int64_t>(blocks.size()) * block_size_;
  return static_cast<int>(blocks.size());
}

void BlockManager::commit(std::span<const int32_t> tokens, int n_computed, const std::vector<int32_t>& blocks,
                          std::vector<uint64_t>& hashes, int& n_committed) {
  if (!prefix_caching()) return;
  int n_full = std::min<int>(n_computed / block_size_, static_cast<int>(blocks.size()));
  for (int i = n_committed; i < n_full; ++i) {
    if (blocks[i] < 0) continue;           // given back by the rotating cache
    uint64_t h = chain_hash(tokens, hashes, i);
    Info& in = info_[blocks[i]];
    if (in.hashed) continue;               // reused from the cache: already registered
    if (by_hash_.count(h)) continue;       // the same prefix is cached in another block already
    in.hashed = true;
    in.hash = h;
    in.tokens.assign(tokens.begin() + static_cast<size_t>(i) * block_size_,
                     tokens.begin() + static_cast<size_t>(i + 1) * block_size_);
    by_hash_.emplace(h, blocks[i]);
    if (record_) committed_.push_back({h, blocks[i]});
  }
  n_committed = std::max(n_committed, n_full);
}

}  // namespace kiln::engine
