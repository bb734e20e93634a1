// snapshot_download over libcurl: list, filter, fetch in parallel with resume and verification.
#include "kiln/hub/pull.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "kiln/base/error.h"
#include "kiln/hub/api.h"
#include "kiln/hub/cache.h"
#include "kiln/hub/hash.h"
#include "kiln/hub/progress.h"

namespace kiln::hub {
namespace fs = std::filesystem;

const std::vector<std::string>& default_pull_patterns() {
  static const std::vector<std::string> p = {"*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken",
                                             "merges.txt", "vocab.txt"};
  return p;
}

bool glob_match(const std::string& pattern, const std::string& path) {
  std::string p = pattern;
  if (!p.empty() && p.back() == '/') p += '*';
  return fnmatch(p.c_str(), path.c_str(), FNM_NOESCAPE) == 0;
}

bool keep_path(const std::string& path, const std::vector<std::string>& include, const std::vector<std::string>& exclude) {
  bool in = include.empty();
  for (const auto& p : include) in = in || glob_match(p, path);
  if (!in) return false;
  for (const auto& p : exclude)
    if (glob_match(p, path)) return false;
  return true;
}

namespace {

struct RemoteFile {
  std::string path, etag;
  uint64_t size = 0;
  bool lfs = false;
};

// An exclusive flock held for a scope (the blob's download).
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("hub", "cannot open the lock file {}", path);
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }

 private:
  int fd_;
};

// The Link header's rel="next" URL, or "".
std::string next_link(const std::string& link) {
  size_t rel = link.find("rel=\"next\"");
  if (rel == std::string::npos) return {};
  size_t open = link.rfind('<', rel), close = link.find('>', open);
  if (open == std::string::npos || close == std::string::npos || close > rel) return {};
  return link.substr(open + 1, close - open - 1);
}

std::vector<RemoteFile> list_files(HttpClient& http, const std::string& repo, const std::string& commit,
                                   const HubConfig& cfg) {
  std::vector<RemoteFile> files;
  std::string url = cfg.endpoint + "/api/models/" + repo + "/tree/" + commit + "?recursive=true&expand=false";
  while (!url.empty()) {
    HttpRequest req;
    req.url = url;
    for (auto& h : hub_headers(cfg)) req.headers.push_back(h);
    req.timeout_s = 120;
    HttpResponse r = http.send(req);
    raise_for_status(r, repo + "@" + commit + " (listing files)", cfg);
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (!j.is_array()) fail("hub", "{}: the tree listing is not a JSON array: {}", repo, r.body.substr(0, 200));
    for (const auto& e : j) {
      if (e.value("type", "") != "file") continue;
      RemoteFile f;
      f.path = e.value("path", "");
      f.size = e.value("size", uint64_t{0});
      if (e.contains("lfs") && e["lfs"].is_object()) {
        f.lfs = true;
        f.etag = e["lfs"].value("oid", "");
        f.size = e["lfs"].value("size", f.size);
      } else {
        f.etag = e.value("oid", "");
      }
      if (!safe_repo_path(f.path)) fail("hub", "{}: the Hub listed an unsafe path \"{}\"", repo, f.path);
      bool hex_ok = f.etag.size() == (f.lfs ? 64u : 40u);
      for (char c : f.etag) hex_ok = hex_ok && std::isxdigit(static_cast<unsigned char>(c));
      if (!hex_ok) fail("hub", "{}: file {} has a malformed oid \"{}\"", repo, f.path, f.etag);
      files.push_back(std::move(f));
    }
    url = next_link(r.header("link"));
  }
  return files;
}

// blobs/<etag>, downloaded (resuming blobs/<etag>.incomplete) and verified, unless present. Returns bytes fetched.
uint64_t fetch_blob(HttpClient& http, const RepoCache& cache, const std::string& repo, const std::string& commit,
                    const RemoteFile& f, const HubConfig& cfg, ProgressLine& prog) {
  FileLock lock(cache.lock_file(f.etag));
  std::error_code ec;
  const std::string blob = cache.blob(f.etag), part = cache.incomplete(f.etag);
  if (fs::exists(blob, ec)) return 0;  // another worker (same content under two names) finished it

  Digest::Kind kind = f.lfs ? Digest::kSha256 : Digest::kSha1;
  auto digest = std::make_unique<Digest>(kind);
  auto restart_digest = [&] {
    digest = std::make_unique<Digest>(kind);
    if (!f.lfs) {
      std::string head = "blob " + std::to_string(f.size);
      digest->update(head.data(), head.size() + 1);
    }
  };
  restart_digest();
  uint64_t have = fs::exists(part, ec) ? fs::file_size(part, ec) : 0;
  if (have > f.size) {
    fs::remove(part, ec);
    have = 0;
  }
  if (have > 0) {  // the digest over what an earlier pull left
    FILE* in = std::fopen(part.c_str(), "rb");
    std::vector<char> buf(1 << 20);
    size_t n;
    while (in && (n = std::fread(buf.data(), 1, buf.size(), in)) > 0) digest->update(buf.data(), n);
    if (in) std::fclose(in);
  }
  prog.add(static_cast<int64_t>(have));
  FILE* out = std::fopen(part.c_str(), "ab");
  if (!out) fail("hub", "cannot write {}", part);
  uint64_t fetched = 0;
  const std::string url = cfg.endpoint + "/" + repo + "/resolve/" + commit + "/" + url_escape_path(f.path);
  const std::string what = repo + ": " + f.path;
  int attempt = 0;
  while (have < f.size || f.size == 0) {
    HttpRequest req;
    req.url = url;
    req.headers = hub_headers(cfg);
    req.headers.push_back("Accept-Encoding: identity");
    if (have > 0) req.headers.push_back("Range: bytes=" + std::to_string(have) + "-");
    bool first = true;
    bool write_failed = false, oversize = false;
    req.sink = [&](long status, const char* data, size_t n) {
      if (first) {
        first = false;
        if (have > 0 && status == 200) {  // the server ignored the Range: start over
          std::fflush(out);
          if (ftruncate(fileno(out), 0) != 0) return false;
          prog.add(-static_cast<int64_t>(have));
          have = 0;
          restart_digest();
        }
      }
      if (have + n > f.size) {  // more than the listing said: refuse, the file is wrong
        oversize = true;
        return false;
      }
      if (std::fwrite(data, 1, n, out) != n) {
        write_failed = true;
        return false;
      }
      digest->update(data, n);
      have += n;
      fetched += n;
      prog.add(static_cast<int64_t>(n));
      return true;
    };
    const uint64_t before = have;
    HttpResponse r = http.send_once(req);
    if (std::fflush(out) != 0 || std::ferror(out)) write_failed = true;
    if (write_failed) {
      std::fclose(out);
      fail("hub", "{}: cannot write {} (disk full?); the partial download is kept and resumes next time", what, part);
    }
    if (oversize) {
      std::fclose(out);
      fs::remove(part, ec);
      fail("hub", "{}: the Hub sent more than the {} bytes the listing said; nothing was kept", what, f.size);
    }
    if (r.ok() && have == f.size) break;
    if (r.status == 416 && have == f.size) break;  // the partial file was already whole
    if (r.ok() && have != f.size) {
      std::fclose(out);
      fs::remove(part, ec);
      fail("hub", "{}: the Hub sent {} bytes where the listing said {}; nothing was kept, run kiln pull again", what,
           have, f.size);
    }
    if (!retryable(r) || attempt >= http.retry_policy().max_retries) {
      std::fclose(out);
      if (have > 0 && retryable(r))
        fail("hub", "{}: the download broke off at {} of {} bytes ({}); {} is kept: run kiln pull again to resume", what,
             have, f.size, r.error.empty() ? "HTTP " + std::to_string(r.status) : r.error, part);
      raise_for_status(r, what, cfg);
      fail("hub", "{}: download failed", what);
    }
    if (have > before) attempt = 0;  // progress was made: a flaky link gets its retries afresh
    http.backoff(attempt++, what, r);
  }
  std::fclose(out);
  const std::string got = digest->hex();
  if (got != f.etag) {
    fs::remove(part, ec);
    fail("hub", "{}: the downloaded bytes' {} is {}, not the Hub's {}; the download was deleted, run kiln pull again",
         what, f.lfs ? "sha256" : "git blob sha1", got, f.etag);
  }
  fs::rename(part, blob, ec);
  if (ec) fail("hub", "cannot move {} to {}: {}", part, blob, ec.message());
  return fetched;
}

PullResult pull_offline(const PullOptions& opt, const HubConfig& cfg) {
  RepoCache cache(cfg.cache_dir, opt.repo);
  PullResult res;
  res.commit = cache.read_ref(opt.revision);
  std::error_code ec;
  if (res.commit.empty() || !fs::is_directory(cache.snapshot(res.commit), ec))
    fail("hub", "{}@{} is not in the HF cache at {} and HF_HUB_OFFLINE is set: unset it to download", opt.repo,
         opt.revision, cache.root());
  res.snapshot = cache.snapshot(res.commit);
  for (const auto& e : fs::recursive_directory_iterator(res.snapshot, ec))
    if (!e.is_directory(ec)) ++res.files;
  return res;
}

}  // namespace

PullResult pull(const PullOptions& opt, const HubConfig& cfg) {
  if (cfg.offline) return pull_offline(opt, cfg);
  HttpClient http(cfg.retry);
  const std::string what = opt.repo + "@" + opt.revision;
  HttpRequest info;
  info.url = cfg.endpoint + "/api/models/" + opt.repo + "/revision/" + url_escape(opt.revision);
  nlohmann::json j = send_json(http, info, what, cfg);
  PullResult res;
  res.commit = j.value("sha", "");
  if (!is_commit_hash(res.commit)) fail("hub", "{}: the Hub's model info has no commit sha", what);

  std::vector<RemoteFile> all = list_files(http, opt.repo, res.commit, cfg);
  const auto& include = opt.include.empty() ? default_pull_patterns() : opt.include;
  std::vector<RemoteFile> files;
  for (auto& f : all)
    if (keep_path(f.path, include, opt.exclude)) files.push_back(f);
  if (files.empty()) {
    std::string names;
    for (size_t i = 0; i < all.size() && i < 20; ++i) names += (i ? ", " : "") + all[i].path;
    fail("hub", "{}: no file matches the patterns (the repo has {} files{}{})", what, all.size(),
         all.empty() ? "" : ": ", names);
  }

  if (opt.include.empty() &&
      std::none_of(files.begin(), files.end(), [](const RemoteFile& f) { return f.path.ends_with(".safetensors"); }))
    std::fprintf(stderr, "[hub] warning: %s has no .safetensors weights (kiln reads safetensors only); pulling the "
                 "rest. Pass --include '*' for every file\n", what.c_str());
  RepoCache cache(cfg.cache_dir, opt.repo);
  cache.prepare();
  cache.write_ref(opt.revision, res.commit);
  res.snapshot = cache.snapshot(res.commit);
  res.files = files.size();

  std::vector<const RemoteFile*> todo;
  uint64_t todo_bytes = 0;
  std::error_code ec;
  for (const auto& f : files) {
    if (fs::exists(cache.pointer(res.commit, f.path), ec)) continue;  // linked and its blob there
    todo.push_back(&f);
    todo_bytes += f.size;
  }
  // huggingface_hub's _check_disk_space: a warning (the write error, if it comes, says the rest).
  if (struct statvfs st{}; todo_bytes > 0 && statvfs((cache.root() + "/blobs").c_str(), &st) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    if (free_bytes < todo_bytes)
      std::fprintf(stderr, "[hub] warning: %s needs %s and %s has %s free\n", opt.repo.c_str(),
                   format_bytes(static_cast<double>(todo_bytes)).c_str(), cfg.cache_dir.c_str(),
                   format_bytes(static_cast<double>(free_bytes)).c_str());
  }
  std::atomic<size_t> next{0}, downloaded{0};
  std::atomic<uint64_t> fetched_bytes{0};
  std::mutex err_mu;
  std::string first_error;
  {
    ProgressLine prog("pull", cfg.progress, todo_bytes, todo.size());
    auto worker = [&] {
      HttpClient client(cfg.retry);
      for (size_t i; (i = next++) < todo.size();) {
        const RemoteFile& f = *todo[i];
        try {
          uint64_t got = fetch_blob(client, cache, opt.repo, res.commit, f, cfg, prog);
          cache.link(res.commit, f.path, f.etag);
          fetched_bytes += got;
          if (got > 0 || f.size == 0) ++downloaded;
          prog.file_done(f.path, f.size);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> g(err_mu);
          if (first_error.empty()) first_error = e.what();
        }
      }
    };
    const size_t n_workers = std::min<size_t>(std::max(cfg.max_workers, 1), std::max<size_t>(todo.size(), 1));
    std::vector<std::thread> pool;
    for (size_t i = 0; i < n_workers; ++i) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
  }
  if (!first_error.empty()) throw Error("hub", first_error.substr(first_error.rfind("[hub] ", 0) == 0 ? 6 : 0));
  res.files_downloaded = downloaded;
  res.bytes_downloaded = fetched_bytes;
  return res;
}

}  // namespace kiln::hub
