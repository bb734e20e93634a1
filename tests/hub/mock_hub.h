// A mock Hugging Face Hub on loopback (cpp-httplib, in the test process) implementing the endpoints
// kiln's hub/ calls, shaped as the real Hub answers them (huggingface_hub's source is the reference):
//   GET  /api/models/ORG/NAME/revision/REV        {"id", "sha", "siblings"}
//   GET  /api/models/ORG/NAME/tree/REV?recursive=true  paged by a Link: <...>; rel="next" header
//   GET  /ORG/NAME/resolve/REV/PATH               ETag / X-Repo-Commit (+ X-Linked-Etag/-Size and a 302
//                                                 to /cdn-lfs/<sha256> for LFS files); Range honoured
//   POST /api/repos/create                        200, or 409 when it exists
//   POST /api/models/ORG/NAME/branch/B            a branch from main's head, or 409
//   POST /api/models/ORG/NAME/preupload/REV       uploadMode lfs for weights / large files, else regular
//   POST /ORG/NAME.git/info/lfs/objects/batch     basic (PUT /lfs-upload/OID) or, above multipart_threshold,
//                                                 multipart (PUT /lfs-part/OID/N + POST /lfs-complete/OID);
//                                                 verify at /lfs-verify; no actions for a stored oid
//   POST /api/models/ORG/NAME/commit/REV          NDJSON header/file/lfsFile lines -> {"commitOid", ...}
// with a token check (401), gated repos (403), unknown repos (404 RepoNotFound) and failure injection.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace kiln::hubtest {

struct MockFile {
  std::string content;
  bool lfs = false;
};
using MockTree = std::map<std::string, MockFile>;

class MockHub {
 public:
  MockHub();
  ~MockHub();
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // A commit on `branch` of repo (created when new) holding exactly `files`; returns its sha.
  std::string add_commit(const std::string& repo, const std::string& branch, const MockTree& files);
  // The tree `branch` (or a commit sha) of repo names now; empty when unknown.
  MockTree tree(const std::string& repo, const std::string& revision);
  bool has_repo(const std::string& repo);

  // Everything below is read and written under mu().
  std::mutex& mu() { return mu_; }
  std::string required_token;       // "": anonymous allowed
  std::set<std::string> gated;      // repos that answer 403
  size_t tree_page_size = 3;        // entries per page of the tree listing
  uint64_t multipart_threshold = 1 << 20, chunk_size = 256 << 10;
  // Faults. fail_500: requests whose "METHOD /path" contains the key get a 500 while the count lasts.
  std::map<std::string, int> fail_500;
  // truncate[path in repo] = {absolute offset, times}: that download's connection drops at the offset.
  std::map<std::string, std::pair<uint64_t, int>> truncate;
  std::set<std::string> corrupt;    // paths served with one byte flipped
  // stall[path in repo] = offset: that download hangs at the offset (until the entry is erased or
  // the hub stops; then the connection drops): a client can be killed mid-transfer.
  std::map<std::string, uint64_t> stall;
  // Counters: requests by "METHOD /path", and the file bytes served by path in repo.
  std::map<std::string, int> requests;
  std::map<std::string, uint64_t> served;
  int commits_made = 0;
  int count_requests(const std::string& needle);

 private:
  struct Repo {
    std::map<std::string, std::string> branches;  // name -> commit
    std::map<std::string, MockTree> commits;
    bool isprivate = false;
  };
  std::string commit_of(const Repo& r, const std::string& rev) const;
  void routes();
  std::mutex mu_;
  std::map<std::string, Repo> repos_;
  std::map<std::string, std::string> lfs_;  // sha256 -> bytes
  std::map<std::string, std::map<int, std::string>> parts_;  // multipart uploads under way
  std::unique_ptr<httplib::Server> svr_;
  std::thread thread_;
  int port_ = 0;
  int next_commit_ = 0;
  std::atomic<bool> stopping_{false};
};

}  // namespace kiln::hubtest
