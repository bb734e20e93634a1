// The KV block pool: hands out fixed-size blocks of the paged cache and takes them back.
// No tensor work here; the KvCache holds the memory, this holds the bookkeeping.
#pragma once
#include <cstdint>
#include <vector>

namespace kiln::engine {

class BlockManager {
 public:
  BlockManager(int n_blocks, int block_size);
  int block_size() const { return block_size_; }
  int n_blocks() const { return n_blocks_; }
  int n_free() const { return static_cast<int>(free_.size()); }
  int n_used() const { return n_blocks_ - n_free(); }
  // Blocks needed to hold n_tokens.
  int blocks_for(int64_t n_tokens) const { return static_cast<int>((n_tokens + block_size_ - 1) / block_size_); }
  // Grows `blocks` to hold n_tokens; false (and no change) when the pool lacks blocks.
  bool ensure(std::vector<int32_t>& blocks, int64_t n_tokens);
  // Returns every block in `blocks` to the pool and clears it.
  void release(std::vector<int32_t>& blocks);

 private:
  int n_blocks_, block_size_;
  std::vector<int32_t> free_;  // a stack: recently freed blocks are reused first (warm in cache)
};

}  // namespace kiln::engine
