#include "kiln/kvstore/block_file.h"

#include <xxhash.h>

#include <cstring>

namespace kiln::kvstore {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'K', 'V', 'B', '\0'};

struct Writer {
  std::vector<std::byte>& out;
  template <typename T>
  void put(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof v);
    std::memcpy(out.data() + at, &v, sizeof v);
  }
  void put_bytes(const void* p, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n);
  }
};

struct Reader {
  std::span<const std::byte> in;
  size_t at = 0;
  bool ok = true;
  template <typename T>
  T get() {
    T v{};
    if (at + sizeof v > in.size()) {
      ok = false;
      return v;
    }
    std::memcpy(&v, in.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
};

}  // namespace

size_t block_header_size(const KvLayout& layout) {
  size_t n = 8 + 4 + 4 + 8 + 8 + 4 + 4;
  for (const PlaneLayout& p : layout.planes) n += 4 + 4 + 8 * p.block_shape.size();
  return n + 4 * static_cast<size_t>(layout.block_size);
}

size_t block_file_size(const KvLayout& layout) { return block_header_size(layout) + layout.block_bytes + 8; }

std::vector<std::byte> encode_block_file(uint64_t store_key, uint64_t chain_hash, std::span<const int32_t> tokens,
                                         const KvLayout& layout, std::span<const std::span<const std::byte>> parts) {
  size_t payload_bytes = 0;
  for (std::span<const std::byte> p : parts) payload_bytes += p.size();
  KILN_ASSERT(tokens.size() == static_cast<size_t>(layout.block_size) && payload_bytes == layout.block_bytes);
  std::vector<std::byte> out;
  out.reserve(block_file_size(layout));
  Writer w{out};
  w.put_bytes(kMagic, sizeof kMagic);
  w.put<uint32_t>(kBlockFileVersion);
  w.put<uint32_t>(static_cast<uint32_t>(block_header_size(layout)));
  w.put<uint64_t>(store_key);
  w.put<uint64_t>(chain_hash);
  w.put<uint32_t>(static_cast<uint32_t>(layout.block_size));
  w.put<uint32_t>(static_cast<uint32_t>(layout.planes.size()));
  for (const PlaneLayout& p : layout.planes) {
    w.put<uint32_t>(static_cast<uint32_t>(p.dtype));
    w.put<uint32_t>(static_cast<uint32_t>(p.block_shape.size()));
    for (int64_t d : p.block_shape) w.put<int64_t>(d);
  }
  w.put_bytes(tokens.data(), tokens.size_bytes());
  for (std::span<const std::byte> p : parts) w.put_bytes(p.data(), p.size());
  w.put<uint64_t>(XXH3_64bits(out.data(), out.size()));
  return out;
}

BlockFileHeader parse_block_header(std::span<const std::byte> bytes, uint64_t store_key, const KvLayout& layout,
                                   std::string& why) {
  BlockFileHeader h;
  why.clear();
  Reader r{bytes};
  char magic[8];
  for (char& c : magic) c = r.get<char>();
  if (!r.ok || std::memcmp(magic, kMagic, sizeof magic) != 0) {
    why = "not a kiln KV block file (bad magic)";
    return h;
  }
  const uint32_t version = r.get<uint32_t>();
  if (r.ok && version != kBlockFileVersion) {
    why = fmt::format("format version {} (this kiln reads {})", version, kBlockFileVersion);
    return h;
  }
  const uint32_t header_bytes = r.get<uint32_t>();
  const uint64_t key = r.get<uint64_t>();
  h.chain_hash = r.get<uint64_t>();
  const uint32_t block_size = r.get<uint32_t>(), n_planes = r.get<uint32_t>();
  if (!r.ok) {
    why = "truncated header";
    return h;
  }
  if (key != store_key) {
    why = "made for another model, tokenizer or KV layout";
    return h;
  }
  if (header_bytes != block_header_size(layout) || block_size != static_cast<uint32_t>(layout.block_size) ||
      n_planes != layout.planes.size()) {
    why = "another KV layout (block size or planes)";
    return h;
  }
  for (const PlaneLayout& p : layout.planes) {
    const uint32_t dtype = r.get<uint32_t>(), ndim = r.get<uint32_t>();
    bool same = r.ok && dtype == static_cast<uint32_t>(p.dtype) && ndim == p.block_shape.size();
    for (size_t d = 0; same && d < ndim; ++d) same = r.get<int64_t>() == p.block_shape[d] && r.ok;
    if (!same) {
      why = r.ok ? "another KV layout (a plane's dtype or shape)" : "truncated header";
      return h;
    }
  }
  h.tokens.resize(layout.block_size);
  for (int32_t& t : h.tokens) t = r.get<int32_t>();
  if (!r.ok) why = "truncated header";
  return h;
}

size_t check_block_file(std::span<const std::byte> file, uint64_t store_key, const KvLayout& layout,
                        BlockFileHeader& header, std::string& why) {
  header = parse_block_header(file, store_key, layout, why);
  if (!why.empty()) return 0;
  if (file.size() != block_file_size(layout)) {
    why = fmt::format("{} bytes where a block file has {} (truncated or padded)", file.size(), block_file_size(layout));
    return 0;
  }
  uint64_t sum;
  std::memcpy(&sum, file.data() + file.size() - 8, 8);
  if (sum != XXH3_64bits(file.data(), file.size() - 8)) {
    why = "checksum mismatch (corrupt)";
    return 0;
  }
  return block_header_size(layout);
}

}  // namespace kiln::kvstore
