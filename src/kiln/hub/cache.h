// The Hugging Face cache layout, as huggingface_hub's file_download writes it, so kiln, transformers
// and mlx-lm share one cache:
//   <cache>/models--ORG--NAME/blobs/<etag>               the file's bytes; etag = the LFS sha256 (64 hex)
//                                                        or, for a regular git file, its git blob sha1 (40 hex)
//   <cache>/models--ORG--NAME/blobs/<etag>.incomplete    a download under way (resumed with HTTP Range)
//   <cache>/models--ORG--NAME/snapshots/<commit>/<path>  a relative symlink to ../../blobs/<etag>
//                                                        (one more ../ per folder in <path>)
//   <cache>/models--ORG--NAME/refs/<revision>            the commit a branch or tag named (no newline)
//   <cache>/.locks/models--ORG--NAME/<etag>.lock         held while a blob is downloaded
//   <cache>/CACHEDIR.TAG                                 the cache-directory tag backup tools skip
#pragma once
#include <string>

namespace kiln::hub {

// True for a 40-hex commit id (a revision that needs no refs/ entry).
bool is_commit_hash(const std::string& s);

class RepoCache {
 public:
  RepoCache(std::string cache_dir, const std::string& repo);
  const std::string& root() const { return root_; }
  std::string blob(const std::string& etag) const { return root_ + "/blobs/" + etag; }
  std::string incomplete(const std::string& etag) const { return blob(etag) + ".incomplete"; }
  std::string lock_file(const std::string& etag) const;
  std::string snapshot(const std::string& commit) const { return root_ + "/snapshots/" + commit; }
  std::string pointer(const std::string& commit, const std::string& path) const { return snapshot(commit) + "/" + path; }
  // The commit refs/<revision> names, or "" when there is none (a commit hash is its own answer).
  std::string read_ref(const std::string& revision) const;
  // refs/<revision> = commit, unless revision is the commit itself.
  void write_ref(const std::string& revision, const std::string& commit) const;
  // snapshots/<commit>/<path> -> the relative path of blobs/<etag> (replacing a stale link).
  void link(const std::string& commit, const std::string& path, const std::string& etag) const;
  // Creates blobs/, the locks folder and CACHEDIR.TAG.
  void prepare() const;

 private:
  std::string cache_dir_, folder_, root_;
};

// A path inside a repo is safe to join under a snapshot: relative, no "..", ".", empty or "\\" parts.
bool safe_repo_path(const std::string& path);

}  // namespace kiln::hub
