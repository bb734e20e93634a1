#include "kiln/kvstore/ssd_cache.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/base/error.h"
#include "kiln/base/log.h"
#include "kiln/kvstore/block_file.h"

namespace kiln::kvstore {

namespace fs = std::filesystem;

namespace {

constexpr const char* kExt = ".kvb";
// Bytes waiting for the writer at most (a long prompt's blocks arrive faster than a disk takes them).
// They are pinned host memory on CUDA (the download pool keeps what it once held).
constexpr uint64_t kMaxQueuedBytes = 2ull << 30;
constexpr size_t kReadThreads = 8;

std::string hex16(uint64_t v) { return fmt::format("{:016x}", v); }

// Reads the whole file, or up to `limit` bytes; false when it cannot be opened or read.
bool read_file(const std::string& path, std::vector<std::byte>& out, size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return false;
  }
  out.resize(std::min<size_t>(static_cast<size_t>(st.st_size), limit));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return true;
}

// Writes bytes to `tmp` and renames it to `path`; an empty string on success, else why not.
std::string write_atomic(const std::string& tmp, const std::string& path, std::span<const std::byte> bytes) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  size_t put = 0;
  while (put < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + put, bytes.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "short write";
      ::close(fd);
      ::unlink(tmp.c_str());
      return why;
    }
    put += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return why;
  }
  return {};
}

}  // namespace

SsdCache::SsdCache(SsdConfig cfg, uint64_t store_key, KvLayout layout, const std::string& model)
    : cfg_(std::move(cfg)), key_(store_key), layout_(std::move(layout)) {
  folder_ = (fs::path(cfg_.dir) / hex16(key_)).string();
  std::error_code ec;
  fs::create_directories(folder_, ec);
  if (ec) {
    stats_.writable = false;
    log::warn("SSD cache: cannot create {} ({}); only the RAM prefix cache is used", folder_, ec.message());
    return;
  }
  {
    std::ofstream readme(fs::path(folder_) / "README.txt");
    readme << "kiln SSD KV cache (block format " << kBlockFileVersion << ")\nmodel: " << model
           << "\nKV layout: " << layout_.describe() << "\nEach *.kvb file is one block of " << layout_.block_size
           << " tokens; delete the folder to clear it.\n";
  }
  scan();
  log::info("SSD cache: {} ({} blocks, {:.2f} GB of {:.2f} GB)", folder_, stats_.blocks, stats_.bytes / 1e9,
            cfg_.max_bytes / 1e9);
  writer_ = std::thread([this] { writer_loop(); });
}

SsdCache::~SsdCache() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string SsdCache::path_of(uint64_t hash) const { return (fs::path(folder_) / (hex16(hash) + kExt)).string(); }

void SsdCache::scan() {
  struct Found {
    uint64_t hash, bytes;
    fs::file_time_type when;
  };
  std::vector<Found> found;
  std::error_code ec;
  const size_t header = block_header_size(layout_), size = block_file_size(layout_);
  std::vector<std::byte> buf;
  for (const fs::directory_entry& e : fs::directory_iterator(folder_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp") != std::string::npos) {  // a write a crash interrupted
      fs::remove(e.path(), ec);
      continue;
    }
    if (e.path().extension() != kExt) continue;
    std::string why;
    BlockFileHeader h;
    if (!read_file(e.path().string(), buf, header)) why = "unreadable";
    else h = parse_block_header(buf, key_, layout_, why);
    if (why.empty() && e.file_size(ec) != size) why = "truncated or padded";
    if (why.empty() && name != hex16(h.chain_hash) + kExt) why = "its name is not its chain hash";
    if (!why.empty()) {
      log::debug("SSD cache: removing {}: {}", e.path().string(), why);
      fs::remove(e.path(), ec);
      ++stats_.rejected;
      continue;
    }
    found.push_back({h.chain_hash, size, e.last_write_time(ec)});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.when < b.when; });
  std::lock_guard lk(mu_);
  for (const Found& f : found) add_entry(f.hash, f.bytes);
  trim();
}

void SsdCache::add_entry(uint64_t hash, uint64_t bytes) {
  if (index_.count(hash)) return;
  lru_.push_back(hash);
  index_[hash] = {bytes, std::prev(lru_.end())};
  ++stats_.blocks;
  stats_.bytes += static_cast<int64_t>(bytes);
}

void SsdCache::drop_entry(uint64_t hash, bool evicted) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  lru_.erase(it->second.lru);
  --stats_.blocks;
  stats_.bytes -= static_cast<int64_t>(it->second.bytes);
  index_.erase(it);
  ::unlink(path_of(hash).c_str());
  if (evicted) ++stats_.evictions;
}

void SsdCache::trim() {
  while (!lru_.empty() && static_cast<uint64_t>(stats_.bytes) > cfg_.max_bytes) drop_entry(lru_.front(), true);
}

bool SsdCache::contains(uint64_t chain_hash) const {
  std::lock_guard lk(mu_);
  return index_.count(chain_hash) != 0;
}

void SsdCache::note_miss() {
  std::lock_guard lk(mu_);
  ++stats_.misses;
}

std::optional<SsdCache::Loaded> SsdCache::load(uint64_t chain_hash, std::span<const int32_t> tokens,
                                               std::string& why) const {
  Loaded got;
  BlockFileHeader h;
  const std::string path = path_of(chain_hash);
  if (!read_file(path, got.file, block_file_size(layout_) + 1)) why = "unreadable";
  else got.at = check_block_file(got.file, key_, layout_, h, why);
  if (why.empty() && h.chain_hash != chain_hash) why = "another chain hash than its name";
  if (why.empty() && !std::equal(tokens.begin(), tokens.end(), h.tokens.begin(), h.tokens.end()))
    why = "other tokens (a hash collision)";
  if (!why.empty()) return std::nullopt;
  got.file.resize(got.at + layout_.block_bytes);  // (the checksum after the payload)
  return got;
}

void SsdCache::account(uint64_t chain_hash, const Loaded* got, const std::string& why) {
  const std::string path = path_of(chain_hash);
  if (!got) {
    log::warn("SSD cache: rejected {}: {}; it is deleted and recomputed", path, why);
    ++stats_.rejected;
    if (index_.count(chain_hash)) drop_entry(chain_hash, false);
    else ::unlink(path.c_str());
    return;
  }
  if (auto it = index_.find(chain_hash); it != index_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru);  // most recently used
  } else {
    add_entry(chain_hash, block_file_size(layout_));  // another process wrote it
  }
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // the recency survives a restart
  ++stats_.hits;
  stats_.bytes_read += static_cast<int64_t>(block_file_size(layout_));
}

std::optional<std::vector<std::byte>> SsdCache::read(uint64_t chain_hash, std::span<const int32_t> tokens) {
  std::string why;
  std::optional<Loaded> got = load(chain_hash, tokens, why);
  std::lock_guard lk(mu_);
  account(chain_hash, got ? &*got : nullptr, why);
  if (!got) return std::nullopt;
  const std::span<const std::byte> p = got->payload();
  return std::vector<std::byte>(p.begin(), p.end());
}

std::vector<SsdCache::Loaded> SsdCache::read_run(std::span<const uint64_t> hashes, std::span<const int32_t> tokens) {
  const size_t n = hashes.size(), bs = static_cast<size_t>(layout_.block_size);
  KILN_ASSERT(tokens.size() >= n * bs);
  std::vector<std::optional<Loaded>> got(n);
  std::vector<std::string> why(n);
  // Reader threads take the blocks in turn; a failed block stops those after it being read.
  std::atomic<size_t> next{0}, first_bad{n};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < first_bad.load();) {
      got[i] = load(hashes[i], tokens.subspan(i * bs, bs), why[i]);
      if (!got[i]) {
        size_t cur = first_bad.load();
        while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
        }
      }
    }
  };
  const size_t n_threads = std::min<size_t>(n, kReadThreads);
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  std::vector<Loaded> run;
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < n; ++i) {
    account(hashes[i], got[i] ? &*got[i] : nullptr, why[i]);
    if (!got[i]) break;
    run.push_back(std::move(*got[i]));
  }
  return run;
}

void SsdCache::write(uint64_t chain_hash, std::vector<int32_t> tokens, std::shared_ptr<const BlockDownload> from,
                     size_t i) {
  {
    std::lock_guard lk(mu_);
    if (!stats_.writable || !writer_.joinable() || queued_bytes_ + layout_.block_bytes > kMaxQueuedBytes) {
      ++stats_.dropped;
      return;
    }
    if (index_.count(chain_hash)) return;
    queued_bytes_ += layout_.block_bytes;
    queue_.push_back({chain_hash, std::move(tokens), std::move(from), i});
  }
  cv_.notify_one();
}

void SsdCache::write(uint64_t chain_hash, std::vector<int32_t> tokens, std::vector<std::byte> payload) {
  KILN_ASSERT(payload.size() == layout_.block_bytes);
  auto d = std::make_shared<BlockDownload>();
  Tensor t = Tensor::host(DType::u8, {1, static_cast<int64_t>(payload.size())});
  std::memcpy(t.data, payload.data(), payload.size());
  d->planes.push_back(std::move(t));
  d->wait = [] {};
  write(chain_hash, std::move(tokens), std::move(d), 0);
}

void SsdCache::note_dropped(int64_t blocks) {
  std::lock_guard lk(mu_);
  stats_.dropped += blocks;
}

size_t SsdCache::queue_room() const {
  std::lock_guard lk(mu_);
  if (!stats_.writable || !writer_.joinable()) return 0;
  return (kMaxQueuedBytes - std::min(queued_bytes_, kMaxQueuedBytes)) / std::max<size_t>(layout_.block_bytes, 1);
}

void SsdCache::flush() {
  std::unique_lock lk(mu_);
  idle_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

SsdStats SsdCache::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void SsdCache::writing_failed(const std::string& what) {
  if (!stats_.writable) return;
  stats_.writable = false;
  log::warn("SSD cache: {}; blocks are no longer written (the RAM prefix cache and the blocks on disk still serve)",
            what);
}

void SsdCache::writer_loop() {
  // The lowest priority: on a CPU backend the forward's threads own every core, and a writer that
  // takes one from them stalls each step at its barriers; blocks are written when a core is idle.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    Job j = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    store(j);
    lk.lock();
    queued_bytes_ -= layout_.block_bytes;
    busy_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

void SsdCache::store(const Job& j) {
  {
    std::lock_guard lk(mu_);
    if (index_.count(j.hash) || !stats_.writable) return;
  }
  std::vector<std::byte> bytes;
  try {
    j.from->wait();  // the download's copies (at once after the first of its blocks)
    bytes = encode_block_file(key_, j.hash, j.tokens, layout_, j.from->block(j.index));
  } catch (const std::exception& e) {
    std::lock_guard lk(mu_);
    ++stats_.dropped;
    writing_failed(fmt::format("a block's download failed ({})", e.what()));
    return;
  }
  const std::string path = path_of(j.hash);
  const std::string why = write_atomic(fmt::format("{}.tmp{}", path, ::getpid()), path, bytes);
  std::lock_guard lk(mu_);
  if (!why.empty()) {
    ++stats_.dropped;
    writing_failed(fmt::format("writing {} failed ({})", path, why));
    return;
  }
  add_entry(j.hash, bytes.size());
  stats_.bytes_written += static_cast<int64_t>(bytes.size());
  trim();
}

}  // namespace kiln::kvstore
