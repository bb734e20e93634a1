// upload_folder over libcurl (upload.h): scan, create, preupload, LFS batch + transfers, commit.
#include "kiln/hub/upload.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/base/error.h"
#include "kiln/hub/api.h"
#include "kiln/hub/cache.h"
#include "kiln/hub/hash.h"
#include "kiln/hub/model_card.h"
#include "kiln/hub/progress.h"

namespace kiln::hub {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct LocalFile {
  std::string path;     // in the repo ("sub/x.json")
  std::string source;   // on disk; "" when `inline_content` holds the bytes (the generated card)
  std::string inline_content;
  uint64_t size = 0;
  bool lfs = false, ignore = false;
  std::string sha256;
};

std::string read_prefix(const LocalFile& f, size_t n) {
  if (f.source.empty()) return f.inline_content.substr(0, n);
  std::ifstream in(f.source, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

std::string read_all(const LocalFile& f) {
  if (f.source.empty()) return f.inline_content;
  std::ifstream in(f.source, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// huggingface_hub's DEFAULT_IGNORE_PATTERNS: git's own folder and the local-dir download metadata.
bool ignored(const std::string& rel) {
  return rel == ".git" || rel.rfind(".git/", 0) == 0 || rel.find("/.git/") != std::string::npos ||
         rel.rfind(".cache/huggingface", 0) == 0;
}

std::vector<LocalFile> scan(const std::string& dir) {
  std::vector<LocalFile> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) fail("hub", "cannot list {}: {}", dir, ec.message());
    if (!it->is_regular_file(ec)) continue;  // follows symlinks (a folder linking into the HF cache)
    std::string rel = it->path().lexically_relative(dir).generic_string();
    if (ignored(rel)) continue;
    if (!safe_repo_path(rel)) fail("hub", "{}: cannot upload a file named \"{}\"", dir, rel);
    LocalFile f;
    f.path = rel;
    f.source = it->path().string();
    f.size = fs::file_size(it->path());
    files.push_back(std::move(f));
  }
  std::sort(files.begin(), files.end(), [](const LocalFile& a, const LocalFile& b) { return a.path < b.path; });
  return files;
}


// An on_upload_progress that adds what each callback adds to the line (a retried request counts again).
std::function<void(uint64_t)> reporter(ProgressLine& prog) {
  auto seen = std::make_shared<uint64_t>(0);
  return [&prog, seen](uint64_t now) {
    if (now > *seen) prog.add(static_cast<int64_t>(now - *seen));
    *seen = now;
  };
}

// The upload action of one LFS object: basic (one PUT) or multipart (PUT parts, POST the ETags).
uint64_t transfer(HttpClient& http, const LocalFile& f, const json& upload, const HubConfig& cfg, ProgressLine& prog) {
  const std::string href = upload.value("href", "");
  const json header = upload.contains("header") && upload["header"].is_object() ? upload["header"] : json::object();
  if (href.empty()) fail("hub", "{}: the LFS batch answer has an upload action without href", f.path);
  const std::string what = f.path + " (LFS upload)";
  if (!header.contains("chunk_size")) {  // basic
    HttpRequest put;
    put.method = "PUT";
    put.url = href;
    for (const auto& [k, v] : header.items())
      if (v.is_string()) put.headers.push_back(k + ": " + v.get<std::string>());
    put.body_file = f.source;
    put.body_offset = 0;
    put.body_length = f.size;
    put.on_upload_progress = reporter(prog);
    HttpResponse r = http.send(put);
    raise_for_status(r, what, cfg);
    return f.size;
  }
  uint64_t chunk = 0;
  const json& cs = header["chunk_size"];
  if (cs.is_string()) chunk = std::stoull(cs.get<std::string>());
  else if (cs.is_number_unsigned()) chunk = cs.get<uint64_t>();
  if (chunk == 0) fail("hub", "{}: malformed chunk_size in the LFS batch answer", f.path);
  std::vector<std::pair<int, std::string>> parts;
  for (const auto& [k, v] : header.items())
    if (!k.empty() && std::all_of(k.begin(), k.end(), ::isdigit) && v.is_string()) parts.emplace_back(std::stoi(k), v);
  std::sort(parts.begin(), parts.end());
  if (parts.size() != (f.size + chunk - 1) / chunk)
    fail("hub", "{}: the Hub gave {} part URLs for {} bytes in parts of {}", f.path, parts.size(), f.size, chunk);
  json done = json::array();
  for (size_t i = 0; i < parts.size(); ++i) {
    HttpRequest put;
    put.method = "PUT";
    put.url = parts[i].second;
    put.body_file = f.source;
    put.body_offset = i * chunk;
    put.body_length = std::min<uint64_t>(chunk, f.size - i * chunk);
    put.on_upload_progress = reporter(prog);
    HttpResponse r = http.send(put);
    raise_for_status(r, f.path + " (LFS part " + std::to_string(i + 1) + ")", cfg);
    const std::string etag = r.header("etag");
    if (etag.empty()) fail("hub", "{}: part {} came back without an ETag", f.path, i + 1);
    done.push_back({{"partNumber", static_cast<int>(i + 1)}, {"etag", etag}});
  }
  HttpRequest complete;
  complete.method = "POST";
  complete.url = href;
  complete.headers = {"Accept: application/vnd.git-lfs+json", "Content-Type: application/vnd.git-lfs+json"};
  complete.body = json{{"oid", f.sha256}, {"parts", done}}.dump();
  HttpResponse r = http.send(complete);
  raise_for_status(r, f.path + " (LFS multipart completion)", cfg);
  return f.size;
}

}  // namespace

UploadResult upload(const UploadOptions& opt, const HubConfig& cfg) {
  if (cfg.offline) fail("hub", "HF_HUB_OFFLINE is set: cannot upload");
  if (cfg.token.empty())
    fail("hub", "uploading needs a token with write access: pass --token, set HF_TOKEN or run `huggingface-cli login`");
  std::error_code ec;
  if (!fs::is_directory(opt.path, ec)) fail("hub", "--path {}: no such folder", opt.path);
  RepoRef ref = parse_repo_ref(opt.repo);
  const std::string repo = ref.repo;
  UploadResult res;
  std::vector<LocalFile> files = scan(opt.path);
  const bool has_card = std::any_of(files.begin(), files.end(), [](const LocalFile& f) { return f.path == "README.md"; });
  if (opt.model_card && !has_card) {
    LocalFile card;
    card.path = "README.md";
    card.inline_content = model_card(opt.path, repo, opt.base_model);
    card.size = card.inline_content.size();
    files.push_back(card);
    res.generated_card = true;
  }
  if (files.empty()) fail("hub", "--path {}: nothing to upload", opt.path);
  HttpClient http(cfg.retry);
  const std::string api = cfg.endpoint + "/api/models/" + repo;
  const std::string rev = url_escape(opt.revision);

  // 1. The repo.
  {
    HttpRequest req;
    req.method = "POST";
    req.url = cfg.endpoint + "/api/repos/create";
    req.headers = hub_headers(cfg);
    req.headers.push_back("Content-Type: application/json");
    const size_t slash = repo.find('/');
    req.body = json{{"name", repo.substr(slash + 1)}, {"organization", repo.substr(0, slash)},
                    {"private", opt.private_repo}, {"type", "model"}}.dump();
    req.timeout_s = 120;
    HttpResponse r = http.send(req);
    if (r.status != 409) raise_for_status(r, repo + " (creating the repo)", cfg);
    res.created_repo = r.status != 409;
  }

  // 1b. The branch, when it is not main (huggingface_hub's create_branch, exist_ok: 409 = it exists).
  if (opt.revision != "main" && !is_commit_hash(opt.revision)) {
    HttpRequest req;
    req.method = "POST";
    req.url = api + "/branch/" + rev;
    req.headers = hub_headers(cfg);
    req.headers.push_back("Content-Type: application/json");
    req.body = "{}";
    req.timeout_s = 120;
    HttpResponse r = http.send(req);
    if (r.status != 409) raise_for_status(r, repo + "@" + opt.revision + " (creating the branch)", cfg);
  }

  // 2. Regular or LFS, 256 files a call.
  for (size_t b = 0; b < files.size(); b += 256) {
    json list = json::array();
    for (size_t i = b; i < files.size() && i < b + 256; ++i)
      list.push_back({{"path", files[i].path}, {"sample", base64(read_prefix(files[i], 512))}, {"size", files[i].size}});
    HttpRequest req;
    req.method = "POST";
    req.url = api + "/preupload/" + rev;
    req.headers = {"Content-Type: application/json"};
    req.body = json{{"files", list}}.dump();
    json j = send_json(http, req, repo + "@" + opt.revision + " (preupload)", cfg);
    if (!j.contains("files") || !j["files"].is_array()) fail("hub", "{}: malformed preupload answer", repo);
    for (const auto& e : j["files"]) {
      auto it = std::find_if(files.begin(), files.end(), [&](const LocalFile& f) { return f.path == e.value("path", ""); });
      if (it == files.end()) continue;
      const std::string mode = e.value("uploadMode", "");
      if (mode != "lfs" && mode != "regular") fail("hub", "{}: preupload gave \"{}\" for {}", repo, mode, it->path);
      it->lfs = mode == "lfs";
      it->ignore = e.value("shouldIgnore", false);
    }
  }
  for (auto& f : files)
    if (f.lfs && f.source.empty()) f.lfs = false;  // the generated card is small text

  // 3. LFS objects: hashes, then the batch call, then the transfers the Hub asks for.
  std::vector<LocalFile*> lfs;
  for (auto& f : files) {
    if (f.ignore || !f.lfs) continue;
    if (cfg.progress) std::fprintf(stderr, "[upload] hashing %s (%s)\n", f.path.c_str(), format_bytes(static_cast<double>(f.size)).c_str());
    f.sha256 = sha256_file(f.source);
    lfs.push_back(&f);
  }
  res.lfs_files = lfs.size();
  std::vector<std::pair<const LocalFile*, json>> jobs;  // the objects the Hub wants, with their actions
  for (size_t b = 0; b < lfs.size(); b += 256) {
    json objects = json::array();
    for (size_t i = b; i < lfs.size() && i < b + 256; ++i) objects.push_back({{"oid", lfs[i]->sha256}, {"size", lfs[i]->size}});
    HttpRequest req;
    req.method = "POST";
    req.url = cfg.endpoint + "/" + repo + ".git/info/lfs/objects/batch";
    req.headers = {"Accept: application/vnd.git-lfs+json", "Content-Type: application/vnd.git-lfs+json"};
    req.body = json{{"operation", "upload"}, {"transfers", json::array({"basic", "multipart"})}, {"objects", objects},
                    {"hash_algo", "sha256"}, {"ref", {{"name", opt.revision}}}}.dump();
    json j = send_json(http, req, repo + " (LFS batch)", cfg);
    if (!j.contains("objects") || !j["objects"].is_array()) fail("hub", "{}: malformed LFS batch answer", repo);
    for (const auto& o : j["objects"]) {
      auto it = std::find_if(lfs.begin(), lfs.end(), [&](LocalFile* f) { return f->sha256 == o.value("oid", ""); });
      if (it == lfs.end()) continue;
      const LocalFile& f = **it;
      if (o.contains("error"))
        fail("hub", "{}: the LFS batch refused {}: {}", repo, f.path, o["error"].value("message", o["error"].dump()));
      if (!o.contains("actions") || !o["actions"].contains("upload")) {
        if (cfg.progress) std::fprintf(stderr, "[upload] %s: already on the Hub\n", f.path.c_str());
        continue;
      }
      jobs.emplace_back(&f, o["actions"]);
    }
  }
  // The transfers, cfg.max_workers at once; the first failure is raised once all have stopped.
  {
    uint64_t total = 0;
    for (const auto& job : jobs) total += job.first->size;
    ProgressLine prog("upload", cfg.progress, total, jobs.size());
    std::atomic<size_t> next{0};
    std::atomic<uint64_t> sent{0};
    std::mutex err_mu;
    std::string first_error;
    auto worker = [&] {
      HttpClient client(cfg.retry);
      for (size_t i; (i = next++) < jobs.size();) {
        const LocalFile& f = *jobs[i].first;
        const json& actions = jobs[i].second;
        try {
          sent += transfer(client, f, actions["upload"], cfg, prog);
          if (actions.contains("verify")) {
            const json& v = actions["verify"];
            HttpRequest vr;
            vr.method = "POST";
            vr.url = v.value("href", "");
            vr.headers = hub_headers(cfg);
            vr.headers.push_back("Content-Type: application/json");
            if (v.contains("header") && v["header"].is_object())
              for (const auto& [k, h] : v["header"].items())
                if (h.is_string()) vr.headers.push_back(k + ": " + h.get<std::string>());
            vr.body = json{{"oid", f.sha256}, {"size", f.size}}.dump();
            raise_for_status(client.send(vr), f.path + " (LFS verify)", cfg);
          }
          prog.file_done(f.path, f.size);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> g(err_mu);
          if (first_error.empty()) first_error = e.what();
        }
      }
    };
    std::vector<std::thread> pool;
    const size_t n = std::min<size_t>(std::max(cfg.max_workers, 1), std::max<size_t>(jobs.size(), 1));
    for (size_t w = 0; w < n; ++w) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
    if (!first_error.empty()) throw Error("hub", first_error.substr(first_error.rfind("[hub] ", 0) == 0 ? 6 : 0));
    res.lfs_uploaded = jobs.size();
    res.bytes_uploaded += sent;
  }

  // 4. The commit, last: until it lands, the repo is as it was.
  std::string ndjson = json{{"key", "header"},
                            {"value", {{"summary", opt.commit_message}, {"description", opt.commit_description}}}}.dump() + "\n";
  for (const auto& f : files) {
    if (f.ignore) continue;
    ++res.files;
    if (f.lfs) {
      ndjson += json{{"key", "lfsFile"}, {"value", {{"path", f.path}, {"algo", "sha256"}, {"oid", f.sha256}, {"size", f.size}}}}
                    .dump() + "\n";
    } else {
      if (cfg.progress) std::fprintf(stderr, "[upload] %s (%s)\n", f.path.c_str(), format_bytes(static_cast<double>(f.size)).c_str());
      ndjson += json{{"key", "file"}, {"value", {{"content", base64(read_all(f))}, {"path", f.path}, {"encoding", "base64"}}}}
                    .dump() + "\n";
      res.bytes_uploaded += f.size;
    }
  }
  HttpRequest commit;
  commit.method = "POST";
  commit.url = api + "/commit/" + rev;
  commit.headers = {"Content-Type: application/x-ndjson"};
  commit.body = std::move(ndjson);
  json j = send_json(http, commit, repo + "@" + opt.revision + " (commit)", cfg);
  res.commit = j.value("commitOid", "");
  res.commit_url = j.value("commitUrl", "");
  if (res.commit.empty()) fail("hub", "{}: the commit answer has no commitOid: {}", repo, j.dump().substr(0, 200));
  return res;
}

}  // namespace kiln::hub
