// `kiln upload`: a local folder to a Hub model repo, as huggingface_hub's upload_folder/create_commit:
//   1. POST /api/repos/create {"name", "organization", "private", "type": "model"} (409 = it exists),
//      and POST /api/models/ORG/NAME/branch/REV for a branch other than main (409 = it exists);
//   2. POST /api/models/ORG/NAME/preupload/REV: each file's path, size and first 512 bytes (base64) ->
//      uploadMode "regular" or "lfs" (and shouldIgnore, for the repo's .gitignore);
//   3. the LFS files' sha256 (streamed), POST /ORG/NAME.git/info/lfs/objects/batch (operation upload,
//      transfers basic + multipart, hash_algo sha256): objects the Hub has come back without actions;
//      the others are PUT whole (basic) or, when the upload action's header carries chunk_size and part
//      URLs "1".."N", PUT in parts whose ETags are POSTed to the action's href (multipart); then verified;
//   4. POST /api/models/ORG/NAME/commit/REV as NDJSON: a header line (summary, description), a "file"
//      line per regular file (base64 content), an "lfsFile" line per LFS file (path, sha256 oid, size).
// The commit is the last call: a failure before it leaves the repo as it was (uploaded LFS objects
// that no commit names are invisible, and the next upload's batch call skips them).
#pragma once
#include <cstdint>
#include <string>

#include "kiln/hub/config.h"

namespace kiln::hub {

struct UploadOptions {
  std::string path;         // the local folder
  std::string repo;         // ORG/NAME
  std::string revision = "main";
  std::string commit_message = "Upload folder using kiln";
  std::string commit_description;
  std::string base_model;   // for the generated card ("" = from config.json)
  bool private_repo = false;
  bool model_card = true;   // add a generated README.md when the folder has none
};

struct UploadResult {
  std::string commit, commit_url;
  size_t files = 0, lfs_files = 0;
  size_t lfs_uploaded = 0;  // LFS objects sent now (the rest the Hub had)
  uint64_t bytes_uploaded = 0;
  bool created_repo = false, generated_card = false;
};

UploadResult upload(const UploadOptions& opt, const HubConfig& cfg);

}  // namespace kiln::hub
