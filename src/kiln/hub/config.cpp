// Endpoint, token, cache folder and repo ids (see config.h for the precedence rules).
#include "kiln/hub/config.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kiln/base/error.h"
#include "kiln/io/model_path.h"

namespace kiln::hub {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_true(const char* name) {
  std::string v = env(name);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "on" || v == "yes" || v == "true";
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::string hf_home() {
  if (!env("HF_HOME").empty()) return env("HF_HOME");
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/huggingface";
  if (!env("HOME").empty()) return env("HOME") + "/.cache/huggingface";
  return {};
}

bool part_ok(const std::string& p) {
  if (p.empty() || p == "." || p == ".." || p.size() > 96) return false;
  for (char c : p)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

}  // namespace

HubConfig discover_config(const std::string& token_flag, const std::string& cache_dir_flag) {
  HubConfig c;
  c.endpoint = env("HF_ENDPOINT").empty() ? "https://huggingface.co" : env("HF_ENDPOINT");
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  c.offline = env_true("HF_HUB_OFFLINE") || env_true("TRANSFORMERS_OFFLINE");
  c.progress = !env_true("HF_HUB_DISABLE_PROGRESS_BARS");
  if (!token_flag.empty()) {
    c.token = token_flag, c.token_source = "--token";
  } else if (!trim(env("HF_TOKEN")).empty()) {
    c.token = trim(env("HF_TOKEN")), c.token_source = "$HF_TOKEN";
  } else if (!trim(env("HUGGING_FACE_HUB_TOKEN")).empty()) {
    c.token = trim(env("HUGGING_FACE_HUB_TOKEN")), c.token_source = "$HUGGING_FACE_HUB_TOKEN";
  } else {
    std::string path = !env("HF_TOKEN_PATH").empty() ? env("HF_TOKEN_PATH") : hf_home() + "/token";
    std::ifstream f(path);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      c.token = trim(ss.str());
      if (!c.token.empty()) c.token_source = path;
    }
  }
  if (!cache_dir_flag.empty()) {
    c.cache_dir = cache_dir_flag;
  } else {
    auto dirs = io::hf_hub_cache_dirs();
    if (dirs.empty()) fail("hub", "no Hugging Face cache folder: set HF_HUB_CACHE or HF_HOME, or pass --cache-dir");
    c.cache_dir = dirs.front();
  }
  return c;
}

RepoRef parse_repo_ref(const std::string& arg) {
  RepoRef r;
  std::string repo = arg;
  if (size_t at = arg.find('@'); at != std::string::npos) {
    repo = arg.substr(0, at);
    r.revision = arg.substr(at + 1);
    if (r.revision.empty()) fail("hub", "\"{}\": empty revision after @", arg);
  } else {
    r.revision = "main";
  }
  size_t slash = repo.find('/');
  if (slash == std::string::npos || repo.find('/', slash + 1) != std::string::npos || !part_ok(repo.substr(0, slash)) ||
      !part_ok(repo.substr(slash + 1)))
    fail("hub", "\"{}\" is not a Hugging Face repo id: expected ORG/NAME[@REVISION] (letters, digits, '.', '_', '-')",
         arg);
  r.repo = repo;
  return r;
}

std::string repo_folder_name(const std::string& repo) {
  std::string s = "models--" + repo;
  for (size_t p; (p = s.find('/')) != std::string::npos;) s.replace(p, 1, "--");
  return s;
}

}  // namespace kiln::hub
