// The HF cache layout writer (cache.h).
#include "kiln/hub/cache.h"

#include <cctype>
#include <filesystem>
#include <fstream>

#include "kiln/base/error.h"
#include "kiln/hub/config.h"

namespace kiln::hub {
namespace fs = std::filesystem;

bool is_commit_hash(const std::string& s) {
  if (s.size() != 40) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c)) || std::isupper(static_cast<unsigned char>(c))) return false;
  return true;
}

bool safe_repo_path(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\\') != std::string::npos || path.find('\0') != std::string::npos)
    return false;
  size_t start = 0;
  while (true) {
    size_t slash = path.find('/', start);
    std::string part = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

RepoCache::RepoCache(std::string cache_dir, const std::string& repo)
    : cache_dir_(std::move(cache_dir)), folder_(repo_folder_name(repo)), root_(cache_dir_ + "/" + folder_) {}

std::string RepoCache::lock_file(const std::string& etag) const {
  return cache_dir_ + "/.locks/" + folder_ + "/" + etag + ".lock";
}

std::string RepoCache::read_ref(const std::string& revision) const {
  if (is_commit_hash(revision)) return revision;
  std::ifstream f(root_ + "/refs/" + revision);
  std::string commit;
  if (f) std::getline(f, commit);
  while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
  return is_commit_hash(commit) ? commit : std::string();
}

void RepoCache::write_ref(const std::string& revision, const std::string& commit) const {
  if (revision == commit) return;
  fs::path ref = fs::path(root_) / "refs" / revision;  // "refs/pr/1" nests, as huggingface_hub's does
  std::error_code ec;
  fs::create_directories(ref.parent_path(), ec);
  if (read_ref(revision) == commit) return;
  fs::path tmp = ref;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << commit;
    if (!f) fail("hub", "cannot write {}", tmp.string());
  }
  fs::rename(tmp, ref);
}

void RepoCache::link(const std::string& commit, const std::string& path, const std::string& etag) const {
  fs::path ptr = pointer(commit, path);
  fs::create_directories(ptr.parent_path());
  std::string target = "../../";
  for (char c : path)
    if (c == '/') target += "../";
  target += "blobs/" + etag;
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(ptr, ec))) {
    if (fs::read_symlink(ptr, ec) == target && fs::exists(ptr, ec)) return;
    fs::remove(ptr, ec);
  } else if (fs::exists(fs::symlink_status(ptr, ec))) {
    fs::remove(ptr, ec);  // a copy left by a tool without symlinks: the link replaces it
  }
  fs::create_symlink(target, ptr, ec);
  if (ec) fail("hub", "cannot link {} -> {}: {}", ptr.string(), target, ec.message());
}

void RepoCache::prepare() const {
  std::error_code ec;
  fs::create_directories(root_ + "/blobs", ec);
  if (ec) fail("hub", "cannot create {}: {}", root_ + "/blobs", ec.message());
  fs::create_directories(cache_dir_ + "/.locks/" + folder_, ec);
  fs::path tag = fs::path(cache_dir_) / "CACHEDIR.TAG";
  if (!fs::exists(tag, ec)) {
    std::ofstream f(tag);
    f << "Signature: 8a477f597d28d172789f06886806bc55\n"
         "# This file is a cache directory tag created by huggingface_hub.\n"
         "# For information about cache directory tags, see:\n"
         "#\thttps://bford.info/cachedir/\n";
  }
}

}  // namespace kiln::hub
