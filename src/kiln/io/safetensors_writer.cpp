// The safetensors writer: one file (header padded with spaces to 8 bytes, data in the given
// order, no gaps — the layout Hugging Face's reader requires), or a folder of shards of at most
// max_shard_bytes tensor bytes each plus model.safetensors.index.json. Files are written to a
// temporary name and renamed, so a reader never sees half a file.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "kiln/base/error.h"
#include "kiln/base/json.h"
#include "kiln/base/utf8.h"
#include "kiln/io/safetensors.h"

namespace kiln::io {
namespace fs = std::filesystem;
namespace {

using Named = std::pair<std::string, Tensor>;

// Bad tensors are caller bugs or bad user input (a convert of a broken model); say which one.
void check_tensors(const std::string& path, const std::vector<Named>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__" || !utf8::valid(name))
      fail("safetensors", "{}: cannot write a tensor named \"{}\" (names must be non-empty UTF-8 and not __metadata__)", path, name);
    if (!seen.insert(name).second) fail("safetensors", "{}: tensor \"{}\" is listed twice", path, name);
    if (t.device != Device::cpu) fail("safetensors", "{}: tensor \"{}\" is not in host memory; copy it to the CPU first", path, name);
    for (auto d : t.shape)
      if (d < 0) fail("safetensors", "{}: tensor \"{}\" has a negative dimension in shape {}", path, name, shape_str(t.shape));
    if (t.nbytes() > 0 && t.data == nullptr) fail("safetensors", "{}: tensor \"{}\" has no data", path, name);
  }
  for (const auto& [k, v] : metadata)
    if (!utf8::valid(k) || !utf8::valid(v)) fail("safetensors", "{}: metadata \"{}\" is not valid UTF-8", path, k);
}

// Runs body(FILE*) on a temporary file in the same folder and renames it into place.
template <typename WriteBody>
void write_atomically(const std::string& path, WriteBody body) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("safetensors", "cannot write {}: {}", path, std::strerror(errno));
  bool ok = body(f);
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) err = errno;
    std::remove(tmp.c_str());
    fail("safetensors", "cannot write {}: {}", path, std::strerror(err));
  }
}

void write_text_file(const std::string& path, const std::string& text) {
  write_atomically(path, [&](FILE* f) { return std::fwrite(text.data(), 1, text.size(), f) == text.size(); });
}

std::string shard_name(size_t i, size_t n) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n); }

// Removes files of a previous write to `dir` that this write did not produce, so open_dir does
// not pick up a stale index or shard: model.safetensors, the index, model-NNNNN-of-NNNNN shards.
void remove_stale(const fs::path& dir, const std::set<std::string>& keep) {
  auto digits = [](const std::string& s, size_t at) {
    for (size_t i = at; i < at + 5; ++i)
      if (s[i] < '0' || s[i] > '9') return false;
    return true;
  };
  auto is_shard = [&](const std::string& n) {  // model-NNNNN-of-NNNNN.safetensors
    return n.size() == 32 && n.compare(0, 6, "model-") == 0 && digits(n, 6) && n.compare(11, 4, "-of-") == 0 &&
           digits(n, 15) && n.compare(20, 12, ".safetensors") == 0;
  };
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    bool ours = n == "model.safetensors" || n == "model.safetensors.index.json" || is_shard(n);
    if (ours && !keep.count(n)) fs::remove(e.path(), ec);
  }
}

}  // namespace

void write_safetensors_file(const std::string& path, const std::vector<Named>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  check_tensors(path, tensors, metadata);
  // Header: {"__metadata__": {...}, name: {dtype, shape, data_offsets}, ...} in the given order.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    uint64_t n = t.nbytes();
    h[name] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string header = h.dump();
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));

  write_atomically(path, [&](FILE* f) {
    if (std::fwrite(len, 1, 8, f) != 8) return false;
    if (std::fwrite(header.data(), 1, header.size(), f) != header.size()) return false;
    for (const auto& [name, t] : tensors) {
      size_t n = t.nbytes();
      if (n > 0 && std::fwrite(t.data, 1, n, f) != n) return false;
    }
    return true;
  });
}

void write_safetensors_dir(const std::string& dir, const std::vector<Named>& tensors,
                           const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) fail("safetensors", "cannot create folder {}: {}", dir, ec ? ec.message() : "not a folder");
  check_tensors(dir, tensors, metadata);

  uint64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.nbytes();
  if (total <= max_shard_bytes) {
    write_safetensors_file((fs::path(dir) / "model.safetensors").string(), tensors, metadata);
    remove_stale(dir, {"model.safetensors"});
    return;
  }

  // Greedy split in the given order: a shard closes when the next tensor would pass the limit.
  std::vector<std::vector<Named>> shards(1);
  uint64_t in_shard = 0;
  for (const auto& nt : tensors) {
    uint64_t n = nt.second.nbytes();
    if (!shards.back().empty() && in_shard + n > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(nt);
    in_shard += n;
  }

  std::set<std::string> written;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::map<std::string, std::string> sorted_map;  // the index lists names sorted, as HF writes it
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string name = shard_name(i, shards.size());
    write_safetensors_file((fs::path(dir) / name).string(), shards[i], metadata);
    written.insert(name);
    for (const auto& [tname, t] : shards[i]) sorted_map[tname] = name;
  }
  for (const auto& [tname, shard] : sorted_map) weight_map[tname] = shard;
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
  // Written last: the index never names a shard that is not on disk yet.
  write_text_file((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  written.insert("model.safetensors.index.json");
  remove_stale(dir, written);
}

}  // namespace kiln::io
