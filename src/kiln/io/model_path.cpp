// Resolves a --model argument: a local folder with config.json, else a Hugging Face repo id in
// the local HF cache (<cache>/models--ORG--NAME/snapshots/<commit>/, the commit refs/main names,
// else the newest snapshot; ORG/NAME@REV: the commit refs/REV names, or the commit REV). Nothing is
// downloaded; the error lists every place looked at.
#include <cctype>
#include <cstdlib>
#include <filesystem>

#include "kiln/base/error.h"
#include "kiln/base/mapped_file.h"
#include "kiln/io/model_path.h"

namespace kiln::io {
namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// "org/name" or a legacy "name": parts of [A-Za-z0-9._-], not "." or "..".
bool looks_like_repo_id(const std::string& s) {
  size_t slash = s.find('/');
  if (slash != std::string::npos && s.find('/', slash + 1) != std::string::npos) return false;
  auto part_ok = [](const std::string& p) {
    if (p.empty() || p == "." || p == "..") return false;
    for (char c : p)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
    return true;
  };
  if (slash == std::string::npos) return part_ok(s);
  return part_ok(s.substr(0, slash)) && part_ok(s.substr(slash + 1));
}

bool has_config(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "config.json", ec);
}

// The snapshot to use in one cache's repo folder, or "" (with the reason added to `looked`).
// revision "" = main's, else the newest; a named revision (ORG/NAME@REV): refs/REV's commit, or the
// snapshot named REV (a commit), and nothing else.
std::string pick_snapshot(const fs::path& repo, const std::string& revision, std::vector<std::string>& looked) {
  std::error_code ec;
  fs::path snapshots = repo / "snapshots";
  if (!fs::is_directory(snapshots, ec)) {
    looked.push_back(snapshots.string() + " (not there)");
    return {};
  }
  if (!revision.empty()) {
    if (revision.find("..") != std::string::npos || revision.front() == '/') {
      looked.push_back("revision \"" + revision + "\" (not a branch, tag or commit name)");
      return {};
    }
    std::string commit = revision;
    fs::path ref_file = repo / "refs" / revision;
    if (fs::is_regular_file(ref_file, ec)) {
      commit = read_file(ref_file.string(), "model");
      while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
    }
    if (!commit.empty() && commit.find('/') == std::string::npos && commit != "." && commit != ".." &&
        has_config(snapshots / commit))
      return (snapshots / commit).string();
    looked.push_back((repo / "refs" / revision).string() + " (no snapshot of revision " + revision + ")");
    return {};
  }
  // refs/main holds the commit hash of the main branch's snapshot.
  fs::path ref_file = repo / "refs" / "main";
  if (fs::is_regular_file(ref_file, ec)) {
    std::string ref = read_file(ref_file.string(), "model");
    while (!ref.empty() && std::isspace(static_cast<unsigned char>(ref.back()))) ref.pop_back();
    if (!ref.empty() && ref.find('/') == std::string::npos && ref != "." && ref != ".." && has_config(snapshots / ref))
      return (snapshots / ref).string();
  }
  // Else the most recently written snapshot that holds a config.json.
  fs::path best;
  fs::file_time_type best_time{};
  for (const auto& e : fs::directory_iterator(snapshots, ec)) {
    if (!e.is_directory(ec) || !has_config(e.path())) continue;
    auto t = fs::last_write_time(e.path(), ec);
    if (ec) continue;
    if (best.empty() || t > best_time) {
      best = e.path();
      best_time = t;
    }
  }
  if (best.empty()) {
    looked.push_back(snapshots.string() + " (no snapshot with config.json)");
    return {};
  }
  return best.string();
}

}  // namespace

std::vector<std::string> hf_hub_cache_dirs() {
  std::vector<std::string> dirs;
  auto push = [&](const std::string& d) {
    if (d.empty()) return;
    std::string n = fs::path(d).lexically_normal().string();
    while (n.size() > 1 && n.back() == '/') n.pop_back();
    for (const auto& x : dirs)
      if (x == n) return;
    dirs.push_back(n);
  };
  push(env("HF_HUB_CACHE"));
  if (!env("HF_HOME").empty()) push(env("HF_HOME") + "/hub");
  if (!env("XDG_CACHE_HOME").empty()) push(env("XDG_CACHE_HOME") + "/huggingface/hub");
  if (!env("HOME").empty()) push(env("HOME") + "/.cache/huggingface/hub");
  return dirs;
}

std::string resolve_model_path(const std::string& arg) {
  if (arg.empty()) fail("model", "empty model argument: pass a folder containing config.json or a Hugging Face repo id (org/name)");
  std::vector<std::string> looked;
  std::error_code ec;

  // 1. A local folder (with ~/ expanded, for arguments that did not pass through a shell).
  std::string local = arg;
  if (local.rfind("~/", 0) == 0 && !env("HOME").empty()) local = env("HOME") + local.substr(1);
  fs::path p(local);
  if (fs::is_directory(p, ec)) {
    if (has_config(p)) return local;
    looked.push_back(local + " (folder without config.json)");
  } else if (fs::exists(p, ec)) {
    looked.push_back(local + " (a file, not a folder)");
  } else {
    looked.push_back(local + " (no such folder)");
  }

  // 2. The Hugging Face cache, for something shaped like a repo id (ORG/NAME[@REVISION]).
  std::string id = arg, revision;
  if (size_t at = arg.find('@'); at != std::string::npos) {
    id = arg.substr(0, at);
    revision = arg.substr(at + 1);
  }
  if (looks_like_repo_id(id) && (id.size() == arg.size() || !revision.empty())) {
    std::string repo_dir = "models--" + id;
    if (size_t s = repo_dir.find('/'); s != std::string::npos) repo_dir.replace(s, 1, "--");
    std::vector<std::string> caches = hf_hub_cache_dirs();
    if (caches.empty()) looked.push_back("no Hugging Face cache (HF_HUB_CACHE, HF_HOME and HOME are unset)");
    for (const auto& cache : caches) {
      std::string snap = pick_snapshot(fs::path(cache) / repo_dir, revision, looked);
      if (!snap.empty()) return snap;
    }
  } else {
    looked.push_back("not a Hugging Face repo id (org/name), so not in the HF cache");
  }

  std::string where;
  for (size_t i = 0; i < looked.size(); ++i) where += (i ? "; " : "") + looked[i];
  fail("model", "cannot find model \"{}\": looked at {}. Pass a folder containing config.json, or a Hugging Face repo id "
       "in the local HF cache (not there: run `kiln pull ORG/NAME`; set HF_HOME or HF_HUB_CACHE if the cache lives elsewhere)",
       arg, where);
}

}  // namespace kiln::io
