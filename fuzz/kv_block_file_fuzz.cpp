// libFuzzer target: arbitrary bytes as an SSD-tier block file (kvstore/block_file.h) of a small
// fixed layout. Each input either passes every check — then its tokens and payload lie inside the
// input and re-encoding them gives the input back byte for byte — or is refused with a reason.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kiln/kvstore/block_file.h"

using namespace kiln;
using namespace kiln::kvstore;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const KvLayout layout = [] {
    KvLayout l;
    l.block_size = 4;
    for (int i = 0; i < 2; ++i) l.planes.push_back({DType::f32, {4, 2}, 32});
    l.planes.push_back({DType::u32, {4, 1}, 16});
    for (const PlaneLayout& p : l.planes) l.block_bytes += p.bytes;
    return l;
  }();
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  BlockFileHeader h;
  std::string why;
  const size_t at = check_block_file(in, 42, layout, h, why);
  if (!why.empty()) {
    if (at != 0) std::abort();
    return 0;
  }
  if (at + layout.block_bytes + 8 != size || h.tokens.size() != 4) std::abort();
  const auto again = encode_block_file(42, h.chain_hash, h.tokens, layout, in.subspan(at, layout.block_bytes));
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  return 0;
}
