// `kiln pull`: a repo's files at a revision into the HF cache, as huggingface_hub's snapshot_download:
// the revision resolved to a commit (GET /api/models/ORG/NAME/revision/REV -> "sha"), the files listed
// from the tree at that commit (GET /api/models/ORG/NAME/tree/COMMIT?recursive=true, paged by the Link
// header), filtered by globs, and each fetched from /ORG/NAME/resolve/COMMIT/PATH into blobs/<etag>
// (cache.h), resumed with Range from blobs/<etag>.incomplete, checked (size; sha256 for LFS files,
// git's blob sha1 for the others) before it is renamed into place and linked from the snapshot.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/hub/config.h"

namespace kiln::hub {

// What kiln needs of a model repo: configs and index files, tokenizers, weights, chat templates.
const std::vector<std::string>& default_pull_patterns();

// huggingface_hub's filter_repo_objects: fnmatch-style, `*` also matches "/", a pattern ending in "/"
// matches everything under that folder; kept if it matches an include (none: all) and no exclude.
bool glob_match(const std::string& pattern, const std::string& path);
bool keep_path(const std::string& path, const std::vector<std::string>& include, const std::vector<std::string>& exclude);

struct PullOptions {
  std::string repo;                  // ORG/NAME
  std::string revision = "main";     // a branch, tag or commit
  std::vector<std::string> include;  // empty: default_pull_patterns()
  std::vector<std::string> exclude;
};

struct PullResult {
  std::string snapshot;  // <cache>/models--ORG--NAME/snapshots/<commit>
  std::string commit;
  size_t files = 0;             // files in the snapshot that matched
  size_t files_downloaded = 0;  // of which fetched now (the rest were in the cache)
  uint64_t bytes_downloaded = 0;
};

// Throws kiln::Error("[hub] ...") on failures (the first failing file's, after the other files
// finished, so that a second pull has less to do). Offline (cfg.offline): the cached snapshot or an error.
PullResult pull(const PullOptions& opt, const HubConfig& cfg);

}  // namespace kiln::hub
