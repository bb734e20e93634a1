#include "kiln/kvstore/prompt_file.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "kiln/base/error.h"
#include "kiln/base/json.h"
#include "kiln/io/safetensors.h"

namespace kiln::kvstore {

namespace {

std::string hex16(uint64_t v) { return fmt::format("{:016x}", v); }

// Tensor name of plane p, mlx-lm's flattened cache-state keys: "{layer}.{i}" (i = 0 keys, 1 values)
// for a float cache; "{layer}.{k}.{j}" for a quantized one (k = 0 keys, 1 values; j = 0 codes,
// 1 scales, 2 biases), as tree_flatten names a QuantizedKVCache's state.
std::string plane_name(const PromptCache& pc, size_t p) {
  const size_t per_layer = pc.layout.planes.size() / pc.n_layers, i = p % per_layer;
  if (pc.layout.quant.on()) return fmt::format("{}.{}.{}", p / per_layer, i / 3, i % 3);
  return fmt::format("{}.{}", p / per_layer, i);
}

// The metadata the checksum covers, in a fixed order.
std::map<std::string, std::string> metadata_of(const PromptCache& pc) {
  Json toks = Json::array();
  for (int32_t t : pc.tokens) toks.push_back(t);
  std::map<std::string, std::string> meta{{"format", "kiln.prompt_cache"},
          {"version", std::to_string(kPromptCacheVersion)},
          {"model", pc.model},
          {"model_fingerprint", hex16(pc.model_fingerprint)},
          {"tokenizer_fingerprint", hex16(pc.tokenizer_fingerprint)},
          {"tokens", toks.dump()},
          {"block_size", std::to_string(pc.layout.block_size)},
          {"n_layers", std::to_string(pc.n_layers)},
          {"n_cached_tokens", std::to_string(static_cast<int64_t>(pc.n_blocks) * pc.layout.block_size)},
          {"kv_layout", pc.layout.describe()},
          {"kv_bits", std::to_string(pc.layout.quant.bits)},
          {"kv_group_size", std::to_string(pc.layout.quant.group_size)},
          {"kv_layout_hash", hex16(pc.layout.hash())}};
  if (pc.max_kv_size > 0) meta["max_kv_size"] = std::to_string(pc.max_kv_size);  // (absent: files before it)
  return meta;
}

uint64_t checksum(const std::map<std::string, std::string>& meta, const std::vector<Tensor>& planes) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const auto& [k, v] : meta) {
    if (k == "checksum") continue;
    XXH3_64bits_update(st, k.data(), k.size() + 1);
    XXH3_64bits_update(st, v.data(), v.size() + 1);
  }
  for (const Tensor& t : planes) XXH3_64bits_update(st, t.data, t.nbytes());
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

uint64_t parse_hex(const std::string& s, const std::string& what, const std::string& path) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail("prompt-cache", "{}: metadata {} is '{}', not 16 hex digits; the file is damaged", path, what, s);
  return std::stoull(s, nullptr, 16);
}

}  // namespace

void save_prompt_cache(const std::string& path, const PromptCache& pc) {
  KILN_ASSERT(pc.n_layers > 0 && pc.layout.planes.size() % pc.n_layers == 0 &&
              std::all_of(pc.layout.planes.begin(), pc.layout.planes.end(),
                          [&](const PlaneLayout& p) { return p.block_shape.at(0) == pc.layout.block_size; }) &&
              pc.data.size() == static_cast<size_t>(pc.n_blocks) * pc.layout.block_bytes);
  // Block-major bytes -> one tensor per plane, rows in token order.
  std::vector<Tensor> planes;
  size_t offset = 0;
  for (const PlaneLayout& p : pc.layout.planes) {
    Shape s = p.block_shape;
    s[0] *= pc.n_blocks;  // [n_blocks * block_size, ...]
    Tensor t = Tensor::host(p.dtype, s);
    for (int b = 0; b < pc.n_blocks; ++b)
      std::memcpy(static_cast<std::byte*>(t.data) + b * p.bytes, pc.data.data() + b * pc.layout.block_bytes + offset,
                  p.bytes);
    offset += p.bytes;
    planes.push_back(std::move(t));
  }
  std::map<std::string, std::string> meta = metadata_of(pc);
  meta["checksum"] = hex16(checksum(meta, planes));
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t p = 0; p < planes.size(); ++p) named.emplace_back(plane_name(pc, p), planes[p]);
  io::write_safetensors_file(path, named, meta);
}

PromptCache load_prompt_cache(const std::string& path) {
  io::SafetensorsFile f = [&] {
    try {
      return io::SafetensorsFile::open(path);
    } catch (const Error& e) {
      fail("prompt-cache", "{} cannot be read as a prompt cache file (truncated or not one): {}", path, e.what());
    }
  }();
  const auto& meta = f.metadata();
  auto get = [&](const char* k) -> const std::string& {
    auto it = meta.find(k);
    if (it == meta.end()) fail("prompt-cache", "{}: not a kiln prompt cache file (no '{}' in its metadata)", path, k);
    return it->second;
  };
  if (get("format") != "kiln.prompt_cache")
    fail("prompt-cache", "{}: not a kiln prompt cache file (format '{}')", path, get("format"));
  if (get("version") != std::to_string(kPromptCacheVersion))
    fail("prompt-cache", "{}: format version {}; this kiln reads version {}: make it again with `kiln cache-prompt`",
         path, get("version"), kPromptCacheVersion);
  PromptCache pc;
  pc.model = get("model");
  pc.model_fingerprint = parse_hex(get("model_fingerprint"), "model_fingerprint", path);
  pc.tokenizer_fingerprint = parse_hex(get("tokenizer_fingerprint"), "tokenizer_fingerprint", path);
  try {
    for (const Json& t : Json::parse(get("tokens"))) pc.tokens.push_back(t.get<int32_t>());
    pc.layout.block_size = std::stoi(get("block_size"));
    pc.n_layers = std::stoi(get("n_layers"));
    if (auto it = meta.find("max_kv_size"); it != meta.end()) pc.max_kv_size = std::stoi(it->second);
    if (meta.count("kv_bits"))  // absent: a file from before quantized caches, float
      pc.layout.quant = {std::stoi(get("kv_bits")), std::stoi(get("kv_group_size"))};
  } catch (const std::exception& e) {
    fail("prompt-cache", "{}: damaged metadata ({})", path, e.what());
  }
  const int bs = pc.layout.block_size;
  if (bs <= 0 || pc.n_layers <= 0) fail("prompt-cache", "{}: damaged metadata (block_size, n_layers)", path);
  if (pc.layout.quant.on() && ((pc.layout.quant.bits != 4 && pc.layout.quant.bits != 8) || pc.layout.quant.group_size <= 0))
    fail("prompt-cache", "{}: damaged metadata (kv_bits {}, kv_group_size {})", path, pc.layout.quant.bits,
         pc.layout.quant.group_size);
  // The planes in order (plane_name): per layer l, "{l}.{i}" for i = 0, 1, ... while present, or
  // "{l}.{k}.{j}" for k = 0, 1 and j = 0, 1, 2 when quantized.
  std::vector<Tensor> planes;
  for (int l = 0; l < pc.n_layers; ++l)
    for (int i = 0;; ++i) {
      const std::string name =
          pc.layout.quant.on() ? (i < 6 ? fmt::format("{}.{}.{}", l, i / 3, i % 3) : "") : fmt::format("{}.{}", l, i);
      auto it = f.tensors().find(name);
      if (it == f.tensors().end()) break;
      planes.push_back(it->second);
    }
  if (planes.size() != f.tensors().size() || planes.empty() || planes.size() % pc.n_layers != 0)
    fail("prompt-cache", "{}: its tensors are not the K/V planes of {} layers; the file is damaged", path, pc.n_layers);
  const int64_t rows = planes[0].ndim() > 0 ? planes[0].dim(0) : -1;
  if (rows < 0 || rows % bs != 0 || rows > static_cast<int64_t>(pc.tokens.size()))
    fail("prompt-cache", "{}: {} cached rows for {} tokens in blocks of {}; the file is damaged", path, rows,
         pc.tokens.size(), bs);
  pc.n_blocks = static_cast<int>(rows / bs);
  for (const Tensor& t : planes) {
    if (t.ndim() < 1 || t.dim(0) != rows) fail("prompt-cache", "{}: planes of different lengths; the file is damaged", path);
    PlaneLayout p;
    p.dtype = t.dtype;
    p.block_shape = t.shape;
    p.block_shape[0] = bs;
    p.bytes = static_cast<size_t>(shape_numel(p.block_shape)) * dtype_size(t.dtype);
    pc.layout.block_bytes += p.bytes;
    pc.layout.planes.push_back(std::move(p));
  }
  if (parse_hex(get("checksum"), "checksum", path) != checksum(meta, planes))
    fail("prompt-cache", "{}: checksum mismatch (the file is corrupt); make it again with `kiln cache-prompt`", path);
  pc.data.resize(static_cast<size_t>(pc.n_blocks) * pc.layout.block_bytes);
  size_t offset = 0;
  for (size_t p = 0; p < planes.size(); ++p) {
    const size_t pb = pc.layout.planes[p].bytes;
    for (int b = 0; b < pc.n_blocks; ++b)
      std::memcpy(pc.data.data() + b * pc.layout.block_bytes + offset, static_cast<const std::byte*>(planes[p].data) + b * pb, pb);
    offset += pb;
  }
  return pc;
}

std::vector<std::byte> reblock(const PromptCache& pc, const KvLayout& layout, int& n) {
  KILN_ASSERT(layout.planes.size() == pc.layout.planes.size());
  const int bs = layout.block_size;
  n = pc.n_cached_tokens() / bs;
  if (bs == pc.layout.block_size) return pc.data;
  std::vector<std::byte> out(static_cast<size_t>(n) * layout.block_bytes);
  size_t src_off = 0, dst_off = 0;  // of the plane within a block
  for (size_t p = 0; p < layout.planes.size(); ++p) {
    const size_t row = pc.layout.planes[p].bytes / pc.layout.block_size;  // one token's bytes of this plane
    for (int64_t t = 0; t < static_cast<int64_t>(n) * bs; ++t) {
      const int64_t sb = t / pc.layout.block_size, sr = t % pc.layout.block_size, db = t / bs, dr = t % bs;
      std::memcpy(out.data() + db * layout.block_bytes + dst_off + dr * row,
                  pc.data.data() + sb * pc.layout.block_bytes + src_off + sr * row, row);
    }
    src_off += pc.layout.planes[p].bytes;
    dst_off += layout.planes[p].bytes;
  }
  return out;
}

void check_prompt_cache_model(const PromptCache& pc, const std::string& path, uint64_t model_fingerprint,
                              uint64_t tokenizer_fingerprint) {
  if (pc.model_fingerprint != model_fingerprint)
    fail("prompt-cache", "{} was made for another model ({}); make one for this model with `kiln cache-prompt`",
         path, pc.model);
  if (pc.tokenizer_fingerprint != tokenizer_fingerprint)
    fail("prompt-cache", "{} was made with another tokenizer (model {}); make it again with this model's tokenizer", path,
         pc.model);
}

void check_prompt_cache_layout(const PromptCache& pc, const std::string& path, const KvLayout& layout) {
  auto kv = [](const backend::KvQuant& q) {
    return q.on() ? fmt::format("quantized to {} bits in groups of {} (--kv-bits {} --kv-group-size {})", q.bits,
                                q.group_size, q.bits, q.group_size)
                  : std::string("in float (no --kv-bits)");
  };
  if (!(pc.layout.quant == layout.quant))
    fail("prompt-cache", "{} holds K/V {}; this run's KV cache is {}. Use the same --kv-bits and --kv-group-size, or make "
         "it again with `kiln cache-prompt`", path, kv(pc.layout.quant), kv(layout.quant));
  auto same_rows = [](const PlaneLayout& a, const PlaneLayout& b) {
    return a.dtype == b.dtype && a.block_shape.size() == b.block_shape.size() &&
           std::equal(a.block_shape.begin() + 1, a.block_shape.end(), b.block_shape.begin() + 1);
  };
  if (pc.layout.planes.size() != layout.planes.size() ||
      !std::equal(pc.layout.planes.begin(), pc.layout.planes.end(), layout.planes.begin(), same_rows))
    fail("prompt-cache",
         "{} holds another KV cache layout: the file's is {}; this run's is {}. Use the --kv-bits, --kv-group-size and "
         "--device it was made with, or make it again",
         path, pc.layout.describe(), layout.describe());
}

void check_prompt_cache_rotation(const PromptCache& pc, const std::string& path, int max_kv_size) {
  if (pc.max_kv_size == max_kv_size) return;
  const auto name = [](int m) { return m > 0 ? fmt::format("--max-kv-size {}", m) : std::string("no --max-kv-size"); };
  fail("prompt-cache", "{} was made with {} and this run has {}; use the same setting, or make it again with `kiln "
       "cache-prompt`", path, name(pc.max_kv_size), name(max_kv_size));
}

}  // namespace kiln::kvstore
