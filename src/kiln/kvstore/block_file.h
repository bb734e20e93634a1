// One KV block on disk (the SSD tier's unit). Layout, little-endian:
//   magic "KILNKVB\0" | u32 version | u32 header bytes | u64 store key | u64 chain hash |
//   u32 block size | u32 planes | per plane: u32 dtype, u32 ndim, i64 dims[ndim] |
//   i32 tokens[block size] | payload (KvLayout::block_bytes) | u64 XXH3-64 of all bytes before it.
// The store key names the model, tokenizer and KV layout (the folder holds one key's blocks);
// the chain hash names the whole prefix up to this block (BlockManager's hash chain), and the
// tokens rule out a hash collision. Nothing here does I/O: the parser is fuzzed on raw bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/kvstore/kv_blocks.h"

namespace kiln::kvstore {

inline constexpr uint32_t kBlockFileVersion = 1;

// `parts` together are the payload (e.g. a block's planes as they came off the device).
std::vector<std::byte> encode_block_file(uint64_t store_key, uint64_t chain_hash, std::span<const int32_t> tokens,
                                         const KvLayout& layout, std::span<const std::span<const std::byte>> parts);
inline std::vector<std::byte> encode_block_file(uint64_t store_key, uint64_t chain_hash,
                                                std::span<const int32_t> tokens, const KvLayout& layout,
                                                std::span<const std::byte> payload) {
  return encode_block_file(store_key, chain_hash, tokens, layout, std::span(&payload, 1));
}

// The bytes a file of this layout has in all (header, payload, checksum).
size_t block_file_size(const KvLayout& layout);
// The header's bytes (what the index scan reads of each file).
size_t block_header_size(const KvLayout& layout);

struct BlockFileHeader {
  uint64_t chain_hash = 0;
  std::vector<int32_t> tokens;
};
// Checks a header (the first block_header_size bytes, or the whole file) against the store key and
// the layout; empty `why` on success, else what is wrong ("another version", "another model", ...).
BlockFileHeader parse_block_header(std::span<const std::byte> bytes, uint64_t store_key, const KvLayout& layout,
                                   std::string& why);
// Checks a whole file (header, size, checksum); on success returns the payload's offset into
// `file`, else 0 with `why` set.
size_t check_block_file(std::span<const std::byte> file, uint64_t store_key, const KvLayout& layout,
                        BlockFileHeader& header, std::string& why);

}  // namespace kiln::kvstore
