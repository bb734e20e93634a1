// The mock Hub's routes (mock_hub.h). Handlers run on httplib's worker threads; state under mu_.
#include "mock_hub.h"

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/hub/hash.h"

namespace kiln::hubtest {
namespace {

using nlohmann::json;

std::string sha256_of(const std::string& s) {
  hub::Digest d(hub::Digest::kSha256);
  d.update(s.data(), s.size());
  return d.hex();
}
std::string git_oid(const std::string& s) {
  hub::Digest d(hub::Digest::kSha1);
  std::string head = "blob " + std::to_string(s.size());
  d.update(head.data(), head.size() + 1);
  d.update(s.data(), s.size());
  return d.hex();
}
std::string sha1_of(const std::string& s) {
  hub::Digest d(hub::Digest::kSha1);
  d.update(s.data(), s.size());
  return d.hex();
}
// An ETag's quoted form ("\"<hex>\"").
std::string quoted(const std::string& s) {
  std::string q(1, '"');
  q += s;
  q += '"';
  return q;
}
// The LFS pointer file git stores for an LFS file (its oid is what the tree's "oid" names).
std::string lfs_pointer(const std::string& content) {
  return "version https://git-lfs.github.com/spec/v1\noid sha256:" + sha256_of(content) + "\nsize " +
         std::to_string(content.size()) + "\n";
}
void error(httplib::Response& res, int status, const std::string& code, const std::string& msg) {
  res.status = status;
  if (!code.empty()) res.set_header("X-Error-Code", code);
  res.set_header("X-Error-Message", msg);
  res.set_content(json{{"error", msg}}.dump(), "application/json");
}
bool lfs_by_name(const std::string& path, uint64_t size) {
  for (const char* ext : {".safetensors", ".bin", ".gguf", ".pt", ".npz"}) {
    std::string e = ext;
    if (path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0) return true;
  }
  return size >= 10 * 1000 * 1000;
}

}  // namespace

MockHub::MockHub() : svr_(std::make_unique<httplib::Server>()) {
  routes();
  port_ = svr_->bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { svr_->listen_after_bind(); });
  while (!svr_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

MockHub::~MockHub() {
  stopping_ = true;
  svr_->stop();
  thread_.join();
}

int MockHub::count_requests(const std::string& needle) {
  std::lock_guard<std::mutex> g(mu_);
  int n = 0;
  for (const auto& [k, v] : requests)
    if (k.find(needle) != std::string::npos) n += v;
  return n;
}

std::string MockHub::add_commit(const std::string& repo, const std::string& branch, const MockTree& files) {
  std::lock_guard<std::mutex> g(mu_);
  Repo& r = repos_[repo];
  std::string key = repo + "#" + std::to_string(next_commit_++);
  for (const auto& [p, f] : files) {
    key += "\n" + p + " " + sha256_of(f.content);
    if (f.lfs) lfs_[sha256_of(f.content)] = f.content;
  }
  std::string sha = sha1_of(key);
  r.commits[sha] = files;
  r.branches[branch] = sha;
  return sha;
}

std::string MockHub::commit_of(const Repo& r, const std::string& rev) const {
  if (r.commits.count(rev)) return rev;
  auto it = r.branches.find(rev);
  return it == r.branches.end() ? std::string() : it->second;
}

MockTree MockHub::tree(const std::string& repo, const std::string& revision) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = repos_.find(repo);
  if (it == repos_.end()) return {};
  std::string c = commit_of(it->second, revision);
  return c.empty() ? MockTree{} : it->second.commits[c];
}

bool MockHub::has_repo(const std::string& repo) {
  std::lock_guard<std::mutex> g(mu_);
  return repos_.count(repo) > 0;
}

void MockHub::routes() {
  // Every request: counted, then the token, the 500 faults; returns false when already answered.
  auto gate = [this](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> g(mu_);
    const std::string key = req.method + " " + req.path;
    requests[key]++;
    if (!required_token.empty() && req.path.rfind("/lfs-", 0) != 0 && req.path.rfind("/cdn-lfs/", 0) != 0 &&
        req.get_header_value("Authorization") != "Bearer " + required_token) {
      error(res, 401, "", "Invalid credentials in Authorization header");
      return false;
    }
    for (auto& [needle, left] : fail_500)
      if (left > 0 && key.find(needle) != std::string::npos) {
        --left;
        error(res, 500, "", "Internal Error - We're working hard to fix this as soon as possible!");
        return false;
      }
    return true;
  };
  // The repo (locked by the caller) or a 404/403 answer.
  auto find_repo = [this](const std::string& repo, httplib::Response& res) -> Repo* {
    if (gated.count(repo)) {
      error(res, 403, "GatedRepo", "Access to model " + repo + " is restricted. You must have access to it.");
      return nullptr;
    }
    auto it = repos_.find(repo);
    if (it == repos_.end()) {
      error(res, 404, "RepoNotFound", "Repository not found");
      return nullptr;
    }
    return &it->second;
  };

  svr_->Get(R"(/api/models/([^/]+)/([^/]+)/revision/(.+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    const std::string repo = req.matches[1].str() + "/" + req.matches[2].str();
    Repo* r = find_repo(repo, res);
    if (!r) return;
    std::string c = commit_of(*r, req.matches[3].str());
    if (c.empty()) return error(res, 404, "RevisionNotFound", "Invalid rev id: " + req.matches[3].str());
    json sib = json::array();
    for (const auto& [p, f] : r->commits[c]) sib.push_back({{"rfilename", p}});
    res.set_content(json{{"id", repo}, {"modelId", repo}, {"sha", c}, {"private", r->isprivate}, {"siblings", sib}}.dump(),
                    "application/json");
  });

  svr_->Get(R"(/api/models/([^/]+)/([^/]+)/tree/([^/]+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    const std::string repo = req.matches[1].str() + "/" + req.matches[2].str();
    Repo* r = find_repo(repo, res);
    if (!r) return;
    std::string c = commit_of(*r, req.matches[3].str());
    if (c.empty()) return error(res, 404, "RevisionNotFound", "Invalid rev id");
    // Entries: the folders, then the files, as the Hub lists a recursive tree.
    json all = json::array();
    std::set<std::string> dirs;
    for (const auto& [p, f] : r->commits[c])
      for (size_t s = p.find('/'); s != std::string::npos; s = p.find('/', s + 1)) dirs.insert(p.substr(0, s));
    for (const auto& d : dirs) all.push_back({{"type", "directory"}, {"oid", sha1_of(d)}, {"size", 0}, {"path", d}});
    for (const auto& [p, f] : r->commits[c]) {
      if (f.lfs) {
        std::string ptr = lfs_pointer(f.content);
        all.push_back({{"type", "file"}, {"oid", git_oid(ptr)}, {"size", f.content.size()}, {"path", p},
                       {"lfs", {{"oid", sha256_of(f.content)}, {"size", f.content.size()}, {"pointerSize", ptr.size()}}}});
      } else {
        all.push_back({{"type", "file"}, {"oid", git_oid(f.content)}, {"size", f.content.size()}, {"path", p}});
      }
    }
    size_t start = req.has_param("cursor") ? std::stoul(req.get_param_value("cursor")) : 0;
    json page = json::array();
    for (size_t i = start; i < all.size() && i < start + tree_page_size; ++i) page.push_back(all[i]);
    if (start + tree_page_size < all.size())
      res.set_header("Link", "<" + endpoint() + req.path + "?recursive=true&expand=false&cursor=" +
                                 std::to_string(start + tree_page_size) + ">; rel=\"next\"");
    res.set_content(page.dump(), "application/json");
  });

  // A file's bytes, as a provider so that Range, truncation and byte counts apply.
  auto serve_bytes = [this](const std::string& path, std::string content, httplib::Response& res) {
    if (corrupt.count(path) && !content.empty()) content[content.size() / 2] ^= 0x5a;
    auto data = std::make_shared<std::string>(std::move(content));
    res.set_content_provider(data->size(), "application/octet-stream",
                             [this, data, path](size_t offset, size_t length, httplib::DataSink& sink) {
                               size_t n = std::min<size_t>(length, 16 << 10);
                               bool cut = false;
                               {
                                 std::unique_lock<std::mutex> g(mu_);
                                 for (auto st = stall.find(path); st != stall.end() && offset >= st->second;
                                      st = stall.find(path)) {
                                   if (stopping_) return false;
                                   g.unlock();
                                   std::this_thread::sleep_for(std::chrono::milliseconds(5));
                                   g.lock();
                                   if (stall.find(path) == stall.end()) return false;  // released: drop it
                                 }
                                 if (auto st = stall.find(path); st != stall.end() && offset + n > st->second)
                                   n = st->second - offset;
                                 auto it = truncate.find(path);
                                 if (it != truncate.end() && it->second.second > 0 && offset + n > it->second.first) {
                                   n = it->second.first > offset ? it->second.first - offset : 0;
                                   cut = true;
                                   --it->second.second;
                                 }
                                 served[path] += n;
                               }
                               if (n && !sink.write(data->data() + offset, n)) return false;
                               return !cut;
                             });
  };

  svr_->Get(R"(/([^/]+)/([^/]+)/resolve/([^/]+)/(.+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::unique_lock<std::mutex> g(mu_);
    const std::string repo = req.matches[1].str() + "/" + req.matches[2].str(), path = req.matches[4].str();
    Repo* r = find_repo(repo, res);
    if (!r) return;
    std::string c = commit_of(*r, req.matches[3].str());
    if (c.empty()) return error(res, 404, "RevisionNotFound", "Invalid rev id");
    auto it = r->commits[c].find(path);
    if (it == r->commits[c].end()) return error(res, 404, "EntryNotFound", path + " does not exist on \"" + c + "\"");
    res.set_header("X-Repo-Commit", c);
    if (it->second.lfs) {
      const std::string oid = sha256_of(it->second.content);
      res.set_header("ETag", quoted(git_oid(lfs_pointer(it->second.content))));
      res.set_header("X-Linked-Etag", quoted(oid));
      res.set_header("X-Linked-Size", std::to_string(it->second.content.size()));
      res.set_redirect(endpoint() + "/cdn-lfs/" + oid + "?path=" + path, 302);
      return;
    }
    res.set_header("ETag", quoted(git_oid(it->second.content)));
    std::string content = it->second.content;
    g.unlock();
    serve_bytes(path, std::move(content), res);
  });

  svr_->Get(R"(/cdn-lfs/([0-9a-f]{64}))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::unique_lock<std::mutex> g(mu_);
    auto it = lfs_.find(req.matches[1].str());
    if (it == lfs_.end()) return error(res, 404, "", "no such object");
    std::string content = it->second;
    g.unlock();
    serve_bytes(req.get_param_value("path"), std::move(content), res);
  });

  svr_->Post("/api/repos/create", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    auto j = json::parse(req.body, nullptr, false);
    if (!j.is_object() || !j.contains("name")) return error(res, 400, "", "bad request");
    std::string org = j.value("organization", std::string("user"));
    std::string repo = org + "/" + j["name"].get<std::string>();
    if (repos_.count(repo)) {
      res.status = 409;
      res.set_content(json{{"error", "You already created this model repo"}, {"url", endpoint() + "/" + repo}}.dump(),
                      "application/json");
      return;
    }
    Repo& r = repos_[repo];
    r.isprivate = j.value("private", false);
    MockTree init{{".gitattributes", {"*.safetensors filter=lfs diff=lfs merge=lfs -text\n", false}}};
    std::string sha = sha1_of(repo + "#init");
    r.commits[sha] = init;
    r.branches["main"] = sha;
    res.set_content(json{{"url", endpoint() + "/" + repo}, {"name", repo}}.dump(), "application/json");
  });

  svr_->Post(R"(/api/models/([^/]+)/([^/]+)/branch/(.+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    Repo* r = find_repo(req.matches[1].str() + "/" + req.matches[2].str(), res);
    if (!r) return;
    const std::string b = req.matches[3].str();
    if (r->branches.count(b)) return error(res, 409, "", "Reference already exists");
    r->branches[b] = r->branches["main"];  // from main's head, as the Hub's default starting point
  });

  svr_->Post(R"(/api/models/([^/]+)/([^/]+)/preupload/(.+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    Repo* r = find_repo(req.matches[1].str() + "/" + req.matches[2].str(), res);
    if (!r) return;
    auto j = json::parse(req.body, nullptr, false);
    json out = json::array();
    for (const auto& f : j["files"]) {
      hub::base64_decode(f["sample"].get<std::string>());  // must be valid base64
      out.push_back({{"path", f["path"]},
                     {"uploadMode", lfs_by_name(f["path"], f["size"]) ? "lfs" : "regular"},
                     {"shouldIgnore", false},
                     {"oid", nullptr}});
    }
    res.set_content(json{{"files", out}, {"commitOid", r->branches["main"]}}.dump(), "application/json");
  });

  svr_->Post(R"(/([^/]+)/([^/]+)\.git/info/lfs/objects/batch)", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    if (!find_repo(req.matches[1].str() + "/" + req.matches[2].str(), res)) return;
    auto j = json::parse(req.body, nullptr, false);
    if (j.value("operation", "") != "upload" || j.value("hash_algo", "") != "sha256")
      return error(res, 422, "", "unsupported batch request");
    json objs = json::array();
    for (const auto& o : j["objects"]) {
      const std::string oid = o["oid"];
      const uint64_t size = o["size"];
      json obj = {{"oid", oid}, {"size", size}};
      if (!lfs_.count(oid)) {
        json verify = {{"href", endpoint() + "/lfs-verify"}, {"header", json::object()}};
        if (size > multipart_threshold) {
          json header = {{"chunk_size", std::to_string(chunk_size)}};
          for (uint64_t i = 0; i * chunk_size < size; ++i)
            header[std::to_string(i + 1)] = endpoint() + "/lfs-part/" + oid + "/" + std::to_string(i + 1);
          obj["actions"] = {{"upload", {{"href", endpoint() + "/lfs-complete/" + oid}, {"header", header}}},
                            {"verify", verify}};
        } else {
          obj["actions"] = {{"upload", {{"href", endpoint() + "/lfs-upload/" + oid}, {"header", json::object()}}},
                            {"verify", verify}};
        }
      }
      objs.push_back(obj);
    }
    res.set_content(json{{"transfer", "basic"}, {"objects", objs}}.dump(), "application/vnd.git-lfs+json");
  });

  svr_->Put(R"(/lfs-upload/([0-9a-f]{64}))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    if (sha256_of(req.body) != req.matches[1].str()) return error(res, 400, "", "sha256 mismatch");
    lfs_[req.matches[1].str()] = req.body;
  });

  svr_->Put(R"(/lfs-part/([0-9a-f]{64})/(\d+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    parts_[req.matches[1].str()][std::stoi(req.matches[2].str())] = req.body;
    res.set_header("ETag", quoted(sha1_of(req.body)));
  });

  svr_->Post(R"(/lfs-complete/([0-9a-f]{64}))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    const std::string oid = req.matches[1].str();
    auto j = json::parse(req.body, nullptr, false);
    if (!j.is_object() || j.value("oid", "") != oid) return error(res, 400, "", "bad completion payload");
    std::string all;
    int expect = 1;
    for (const auto& p : j["parts"]) {
      int n = p["partNumber"];
      if (n != expect++ || !parts_[oid].count(n)) return error(res, 400, "", "missing part");
      if (p["etag"].get<std::string>() != quoted(sha1_of(parts_[oid][n]))) return error(res, 400, "", "bad part etag");
      all += parts_[oid][n];
    }
    if (sha256_of(all) != oid) return error(res, 400, "", "sha256 mismatch after assembling the parts");
    lfs_[oid] = all;
    parts_.erase(oid);
  });

  svr_->Post("/lfs-verify", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    auto j = json::parse(req.body, nullptr, false);
    auto it = lfs_.find(j.value("oid", ""));
    if (it == lfs_.end() || it->second.size() != j.value("size", uint64_t{0})) return error(res, 404, "", "object not found");
  });

  svr_->Post(R"(/api/models/([^/]+)/([^/]+)/commit/(.+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!gate(req, res)) return;
    std::lock_guard<std::mutex> g(mu_);
    const std::string repo = req.matches[1].str() + "/" + req.matches[2].str(), branch = req.matches[3].str();
    Repo* r = find_repo(repo, res);
    if (!r) return;
    if (req.get_header_value("Content-Type") != "application/x-ndjson") return error(res, 415, "", "expected NDJSON");
    if (!r->branches.count(branch)) return error(res, 404, "RevisionNotFound", "Invalid rev id: " + branch);
    MockTree t = r->commits[r->branches[branch]];
    std::istringstream in(req.body);
    std::string line, summary;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto j = json::parse(line, nullptr, false);
      if (!j.is_object()) return error(res, 400, "", "bad NDJSON line");
      const std::string key = j.value("key", "");
      const json& v = j["value"];
      if (key == "header") {
        summary = v.value("summary", "");
      } else if (key == "file") {
        if (v.value("encoding", "") != "base64") return error(res, 400, "", "bad encoding");
        t[v["path"]] = {hub::base64_decode(v["content"].get<std::string>()), false};
      } else if (key == "lfsFile") {
        auto it = lfs_.find(v.value("oid", ""));
        if (it == lfs_.end() || it->second.size() != v.value("size", uint64_t{0}) || v.value("algo", "") != "sha256")
          return error(res, 422, "", "LFS object " + v.value("oid", "") + " was not uploaded");
        t[v["path"]] = {it->second, true};
      } else {
        return error(res, 400, "", "unknown key " + key);
      }
    }
    if (summary.empty()) return error(res, 400, "", "no commit summary");
    std::string sha = sha1_of(repo + "#" + std::to_string(next_commit_++));
    r->commits[sha] = t;
    r->branches[branch] = sha;
    ++commits_made;
    res.set_content(json{{"success", true}, {"commitOid", sha}, {"commitUrl", endpoint() + "/" + repo + "/commit/" + sha},
                         {"commitMessage", summary}}.dump(), "application/json");
  });
}

}  // namespace kiln::hubtest
