// read_blocks / write_blocks: per plane, one gather (or scatter) of whole blocks between the plane
// viewed as [n_blocks, block elements] and a contiguous staging tensor, and one host transfer;
// the host side then interleaves planes into block-major order.
#include "kiln/kvstore/kv_blocks.h"

#include <xxhash.h>

#include <cstring>

#include "kiln/base/error.h"
#include "kiln/base/log.h"

namespace kiln::kvstore {

KvLayout KvLayout::of(const model::KvCache& cache) {
  KvLayout l;
  l.block_size = cache.block_size;
  l.quant = cache.quant;
  for (const Tensor* t : cache.planes()) {
    PlaneLayout p;
    p.dtype = t->dtype;
    p.block_shape.assign(t->shape.begin() + 1, t->shape.end());
    p.bytes = static_cast<size_t>(shape_numel(p.block_shape)) * dtype_size(t->dtype);
    l.block_bytes += p.bytes;
    l.planes.push_back(std::move(p));
  }
  return l;
}

uint64_t KvLayout::hash() const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto put = [&](int64_t v) { XXH3_64bits_update(st, &v, sizeof v); };
  put(block_size);
  if (quant.on()) {  // (a float layout hashes as it did before quantized caches)
    put(-quant.bits);
    put(quant.group_size);
  }
  for (const PlaneLayout& p : planes) {
    put(static_cast<int64_t>(p.dtype));
    put(static_cast<int64_t>(p.block_shape.size()));
    for (int64_t d : p.block_shape) put(d);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

std::string KvLayout::describe() const {
  std::string s = quant.on() ? fmt::format("{}-bit KV, groups of {}, ", quant.bits, quant.group_size) : std::string();
  s += fmt::format("{} planes", planes.size());
  // Planes repeat per layer: name each distinct (dtype, shape) once.
  std::vector<const PlaneLayout*> seen;
  for (const PlaneLayout& p : planes) {
    bool dup = false;
    for (const PlaneLayout* q : seen) dup = dup || *q == p;
    if (dup) continue;
    seen.push_back(&p);
    s += fmt::format(", {} {}", dtype_name(p.dtype), shape_str(p.block_shape));
  }
  return s + fmt::format(", block of {} tokens = {:.2f} MiB", block_size, block_bytes / 1048576.0);
}

namespace {

// A plane as [n_blocks, elements of one block].
Tensor as_rows(const Tensor& plane) { return plane.view({plane.dim(0), plane.numel() / plane.dim(0)}); }

Tensor block_ids(backend::Backend& be, std::span<const int32_t> blocks) {
  Tensor ids = Tensor::host(DType::i32, {static_cast<int64_t>(blocks.size())});
  std::memcpy(ids.data, blocks.data(), blocks.size_bytes());
  return be.upload(ids);
}

}  // namespace

std::vector<std::span<const std::byte>> BlockDownload::block(size_t i) const {
  std::vector<std::span<const std::byte>> parts;
  parts.reserve(planes.size());
  for (const Tensor& t : planes) {
    const size_t pb = t.nbytes() / static_cast<size_t>(t.dim(0));
    parts.emplace_back(static_cast<const std::byte*>(t.data) + i * pb, pb);
  }
  return parts;
}

std::shared_ptr<BlockDownload> start_read_blocks(backend::Backend& be, const model::KvCache& cache,
                                                 std::span<const int32_t> blocks) {
  auto d = std::make_shared<BlockDownload>();
  const size_t n = blocks.size();
  if (n == 0) {
    d->wait = [] {};
    return d;
  }
  backend::StepScope scope(be);  // staging buffers from the step arena: later steps run after the copies
  const Tensor ids = block_ids(be, blocks);
  for (const Tensor* plane : cache.planes()) {
    const Tensor rows = as_rows(*plane);
    Tensor staged = be.alloc(rows.dtype, {static_cast<int64_t>(n), rows.cols()});
    be.gather_rows(rows, ids, staged);
    d->planes.push_back(be.to_host_async(staged));
  }
  d->wait = be.fence();
  return d;
}

std::vector<std::byte> read_blocks(backend::Backend& be, const model::KvCache& cache, std::span<const int32_t> blocks) {
  const std::shared_ptr<BlockDownload> d = start_read_blocks(be, cache, blocks);
  d->wait();
  std::vector<std::byte> out;
  out.reserve(blocks.size() * KvLayout::of(cache).block_bytes);
  for (size_t i = 0; i < blocks.size(); ++i)
    for (std::span<const std::byte> part : d->block(i)) out.insert(out.end(), part.begin(), part.end());
  return out;
}

void write_blocks(backend::Backend& be, model::KvCache& cache, std::span<const int32_t> blocks,
                  std::span<const std::span<const std::byte>> data) {
  const KvLayout layout = KvLayout::of(cache);
  const size_t n = blocks.size();
  KILN_ASSERT(data.size() == n);
  for (std::span<const std::byte> b : data) KILN_ASSERT(b.size() == layout.block_bytes);
  if (n == 0) return;
  backend::StepScope scope(be);
  const Tensor ids = block_ids(be, blocks);
  size_t offset = 0;
  const std::vector<Tensor*> planes = cache.planes();
  for (size_t p = 0; p < planes.size(); ++p) {
    Tensor rows = as_rows(*planes[p]);
    const size_t pb = layout.planes[p].bytes;
    Tensor host = Tensor::host(rows.dtype, {static_cast<int64_t>(n), rows.cols()});
    for (size_t i = 0; i < n; ++i)
      std::memcpy(static_cast<std::byte*>(host.data) + i * pb, data[i].data() + offset, pb);
    be.scatter_rows(be.upload(host), ids, rows);
    offset += pb;
  }
  be.synchronize();  // the host staging buffers go when this returns
}

}  // namespace kiln::kvstore
