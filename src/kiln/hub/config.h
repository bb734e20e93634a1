// Where the Hub is and who we are to it, discovered as huggingface_hub's constants.py does:
// the endpoint from $HF_ENDPOINT (default https://huggingface.co), offline mode from $HF_HUB_OFFLINE
// (or $TRANSFORMERS_OFFLINE), the token from --token, $HF_TOKEN, the token file ($HF_TOKEN_PATH, else
// $HF_HOME/token, else $XDG_CACHE_HOME/huggingface/token, else ~/.cache/huggingface/token), and the
// cache folder from --cache-dir, else io::hf_hub_cache_dirs()'s first ($HF_HUB_CACHE, $HF_HOME/hub, ...).
#pragma once
#include <string>

#include "kiln/hub/http.h"

namespace kiln::hub {

struct HubConfig {
  std::string endpoint;   // no trailing slash
  std::string token;      // "" = anonymous
  std::string token_source;  // where the token came from (for messages), "" when none
  std::string cache_dir;  // the hub cache (the folder holding models--ORG--NAME)
  bool offline = false;
  RetryPolicy retry;
  int max_workers = 8;    // files transferred at once
  bool progress = true;   // progress lines on stderr (off with $HF_HUB_DISABLE_PROGRESS_BARS)
  std::string auth_header() const { return token.empty() ? std::string() : "Authorization: Bearer " + token; }
};

// The config from the environment; token_flag / cache_dir_flag override when non-empty.
HubConfig discover_config(const std::string& token_flag = "", const std::string& cache_dir_flag = "");

// "ORG/NAME" checked (parts of [A-Za-z0-9._-]); "ORG/NAME@REV" split into repo and revision.
struct RepoRef {
  std::string repo;       // ORG/NAME
  std::string revision;   // "main" unless given
};
RepoRef parse_repo_ref(const std::string& arg);

// The cache folder of a model repo: "models--ORG--NAME" (huggingface_hub's repo_folder_name).
std::string repo_folder_name(const std::string& repo);

}  // namespace kiln::hub
