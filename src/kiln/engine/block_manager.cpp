// BlockManager: a free stack of block ids.
#include "kiln/engine/block_manager.h"

#include "kiln/base/error.h"

namespace kiln::engine {

BlockManager::BlockManager(int n_blocks, int block_size) : n_blocks_(n_blocks), block_size_(block_size) {
  KILN_ASSERT(n_blocks > 0 && block_size > 0);
  free_.reserve(n_blocks);
  for (int i = n_blocks - 1; i >= 0; --i) free_.push_back(i);
}

bool BlockManager::ensure(std::vector<int32_t>& blocks, int64_t n_tokens) {
  int need = blocks_for(n_tokens) - static_cast<int>(blocks.size());
  if (need <= 0) return true;
  if (need > n_free()) return false;
  for (int i = 0; i < need; ++i) {
    blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockManager::release(std::vector<int32_t>& blocks) {
  for (auto b : blocks) free_.push_back(b);
  blocks.clear();
}

}  // namespace kiln::engine
