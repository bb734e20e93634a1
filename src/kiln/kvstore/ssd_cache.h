// The SSD tier of the prefix cache: full KV blocks kept as files under DIR/<store key>/ (one
// folder per model, tokenizer and KV layout), named by their chain hash, so that a later process
// finds the blocks an earlier one computed. Writes go through a background thread (the engine
// thread only queues bytes); reads are synchronous and validated in full. The index is rebuilt at
// start-up from the files' headers; least recently used files go first when the folder passes its
// byte budget.
//
// Crash safety: a block is written to a temporary name and renamed into place, so a block file
// either exists whole or not at all after a kill -9 (temporaries are deleted at start-up). Files
// are not fsync'ed: after a power loss a renamed file may lack its data, which its checksum then
// rejects. A file that fails any check (magic, version, store key, layout, size, checksum,
// tokens) is deleted and counted, never used. A folder that cannot be written (disk full,
// read-only) turns writing off with one warning; requests never fail because of this tier.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/kvstore/kv_blocks.h"

namespace kiln::kvstore {

struct SsdConfig {
  std::string dir;            // "" = off
  uint64_t max_bytes = 16ull << 30;
};

struct SsdStats {
  int64_t hits = 0, misses = 0;        // blocks read back / lookups that found no block on disk
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t blocks = 0, bytes = 0;       // on disk now
  int64_t evictions = 0, rejected = 0; // files deleted for the budget / for failing a check
  int64_t dropped = 0;                 // blocks not written (queue full or writing off)
  bool writable = true;
};

class SsdCache {
 public:
  // Opens DIR/<store_key as 16 hex digits>/ (creating it), deletes temporaries left by a crash,
  // indexes the block files there (their headers; files of another version, model or layout are
  // deleted and counted) and trims the folder to max_bytes. `model` names the model in a README
  // file written beside the blocks, for people looking at the folder.
  SsdCache(SsdConfig cfg, uint64_t store_key, KvLayout layout, const std::string& model);
  ~SsdCache();  // writes what is queued, then stops the writer
  SsdCache(const SsdCache&) = delete;
  SsdCache& operator=(const SsdCache&) = delete;

  const std::string& folder() const { return folder_; }
  bool contains(uint64_t chain_hash) const;
  // The payload of the block with this chain hash and these tokens, or nothing (a file that fails a
  // check is deleted and counted as rejected).
  std::optional<std::vector<std::byte>> read(uint64_t chain_hash, std::span<const int32_t> tokens);
  // A read block file: its bytes and where the payload starts.
  struct Loaded {
    std::vector<std::byte> file;
    size_t at = 0;
    std::span<const std::byte> payload() const { return std::span(file).subspan(at); }
  };
  // The blocks hashes[0..k) for the longest k whose files all pass their checks (block i's tokens
  // are tokens[i * block_size, (i + 1) * block_size)). The files are read in parallel (a disk
  // serves several reads at once far faster than one after another); the first that fails is
  // deleted and counted, and ends the run.
  std::vector<Loaded> read_run(std::span<const uint64_t> hashes, std::span<const int32_t> tokens);
  void note_miss();
  // Queues block i of a download for writing (dropped when it is on disk already, the queue holds
  // kMaxQueuedBytes or writing is off); the writer waits for the download, the engine thread never.
  void write(uint64_t chain_hash, std::vector<int32_t> tokens, std::shared_ptr<const BlockDownload> from, size_t i);
  void write(uint64_t chain_hash, std::vector<int32_t> tokens, std::vector<std::byte> payload);
  // How many more blocks the queue takes now (so the engine downloads no block it would drop), and
  // blocks the engine left out for that.
  size_t queue_room() const;
  void note_dropped(int64_t blocks);
  void flush();  // returns when the queue is empty
  SsdStats stats() const;

 private:
  struct Entry {
    uint64_t bytes = 0;
    std::list<uint64_t>::iterator lru;
  };
  struct Job {
    uint64_t hash;
    std::vector<int32_t> tokens;
    std::shared_ptr<const BlockDownload> from;
    size_t index;
  };
  std::string path_of(uint64_t hash) const;
  // Reads and checks one file (no lock held); `why` says what is wrong with it.
  std::optional<Loaded> load(uint64_t chain_hash, std::span<const int32_t> tokens, std::string& why) const;
  // Counts a load: a hit refreshes its recency, a failure deletes the file (mu_ held).
  void account(uint64_t chain_hash, const Loaded* got, const std::string& why);
  void scan();
  void writer_loop();
  void store(const Job& j);
  void add_entry(uint64_t hash, uint64_t bytes);  // mu_ held
  void drop_entry(uint64_t hash, bool evicted);   // mu_ held: removes the file too
  void trim();                                    // mu_ held
  void writing_failed(const std::string& what);  // mu_ held

  SsdConfig cfg_;
  uint64_t key_;
  KvLayout layout_;
  std::string folder_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::unordered_map<uint64_t, Entry> index_;
  std::list<uint64_t> lru_;  // least recently used first
  std::deque<Job> queue_;
  uint64_t queued_bytes_ = 0;
  bool busy_ = false, stop_ = false;
  SsdStats stats_;
  std::thread writer_;
};

}  // namespace kiln::kvstore
