// Shared pieces of the hub tests: a mock Hub with a kiln-converted folder (stories260K) published,
// a temporary HF cache, and a HubConfig pointing at both with quick retries.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../io/io_test_util.h"
#include "kiln/hub/config.h"
#include "kiln/hub/hash.h"
#include "mock_hub.h"

namespace kiln::hubtest {

namespace fs = std::filesystem;
using io::test::TempDir;

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string sha256_hex(const std::string& s) {
  hub::Digest d(hub::Digest::kSha256);
  d.update(s.data(), s.size());
  return d.hex();
}

inline std::string git_blob_hex(const std::string& s) {
  hub::Digest d(hub::Digest::kSha1);
  std::string head = "blob " + std::to_string(s.size());
  d.update(head.data(), head.size() + 1);
  d.update(s.data(), s.size());
  return d.hex();
}

// stories260K's files as a repo tree (weights in LFS), plus a nested config and a README that
// the default patterns leave out.
inline MockTree stories_tree() {
  const std::string dir = std::string(KILN_SHARED_DIR) + "/models/stories260K/";
  MockTree t;
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    t[f] = {slurp(dir + f), false};
  t["model.safetensors"] = {slurp(dir + "model.safetensors"), true};
  t["extra/nested/chat_template.jinja"] = {"{{ messages[0]['content'] }}", false};
  t["README.md"] = {"# stories260K\n", false};
  return t;
}

class HubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg.endpoint = hub.endpoint();
    cfg.cache_dir = cache.path();
    cfg.retry = {3, 0.01};
    cfg.progress = false;
  }
  MockHub hub;
  TempDir cache;
  hub::HubConfig cfg;
};

// The kiln::Error message of f(), or "" when it did not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace kiln::hubtest
