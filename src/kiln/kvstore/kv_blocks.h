// KV blocks off the device. A block of a KvCache is every plane's rows of that block (planes()
// order: layer by layer, K then V, then any further planes the layout has); its bytes on the host
// are those rows back to back. KvLayout names what a block holds, so a stored block is only ever
// loaded into a cache of the same layout; read_blocks/write_blocks move many blocks in a few
// device calls per plane (gather/scatter through a staging buffer).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/model/model.h"

namespace kiln::kvstore {

struct PlaneLayout {
  DType dtype = DType::f32;
  Shape block_shape;  // one block's dims (the plane's shape after n_blocks), e.g. [block_size, n_kv_heads * head_dim]
  size_t bytes = 0;   // one block's bytes of this plane
  bool operator==(const PlaneLayout&) const = default;
};

struct KvLayout {
  int block_size = 0;
  backend::KvQuant quant;  // the cache's --kv-bits / group size (bits 0: float planes)
  std::vector<PlaneLayout> planes;
  size_t block_bytes = 0;  // one block over all planes
  static KvLayout of(const model::KvCache& cache);
  uint64_t hash() const;
  // "64 planes, bf16 [16, 1024] ..., 2.00 MiB per block" ("8-bit KV, groups of 64, 192 planes, u32 ..."
  // when quantized), for messages.
  std::string describe() const;
  bool operator==(const KvLayout&) const = default;
};

// Blocks on their way off the device (start_read_blocks): per plane a host tensor
// [n blocks, that plane's bytes of a block], complete once wait() has returned. The copies run
// behind the engine's next steps; the writes that store the blocks share it.
struct BlockDownload {
  std::vector<Tensor> planes;
  std::function<void()> wait;
  // Block i's bytes, plane by plane (valid after wait()).
  std::vector<std::span<const std::byte>> block(size_t i) const;
};
std::shared_ptr<BlockDownload> start_read_blocks(backend::Backend& be, const model::KvCache& cache,
                                                 std::span<const int32_t> blocks);
// The bytes of `blocks` (host, [blocks.size()][layout.block_bytes], block-major).
std::vector<std::byte> read_blocks(backend::Backend& be, const model::KvCache& cache, std::span<const int32_t> blocks);
// Writes one block's bytes per entry of `data` (block_bytes each, as read_blocks lays them out) into
// `blocks` of the cache.
void write_blocks(backend::Backend& be, model::KvCache& cache, std::span<const int32_t> blocks,
                  std::span<const std::span<const std::byte>> data);

}  // namespace kiln::kvstore
