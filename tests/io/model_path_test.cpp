// resolve_model_path: local folders, then the Hugging Face cache in a temporary fake layout
// (HF_HOME / HF_HUB_CACHE pointed at it): refs/main, newest snapshot, precedence, and the
// error that lists every place it looked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>

#include "io_test_util.h"
#include "kiln/io/model_path.h"

namespace kiln::io {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Sets the cache variables for one test and restores them (and the working folder) after.
class ModelPath : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      const char* x = std::getenv(v);
      saved_.emplace_back(v, x ? std::optional<std::string>(x) : std::nullopt);
      unsetenv(v);
    }
    cwd_ = fs::current_path();
    setenv("HOME", (tmp_ / "home").c_str(), 1);
  }
  void TearDown() override {
    fs::current_path(cwd_);
    for (const auto& [v, x] : saved_) {
      if (x) setenv(v, x->c_str(), 1);
      else unsetenv(v);
    }
  }
  // <hub>/models--ORG--NAME/snapshots/<rev>/ with a config.json (or not).
  std::string make_snapshot(const std::string& hub, const std::string& repo_dir, const std::string& rev, bool config = true) {
    std::string dir = hub + "/" + repo_dir + "/snapshots/" + rev;
    fs::create_directories(dir);
    if (config) test::write_bytes(dir + "/config.json", "{}");
    return dir;
  }
  void set_age(const std::string& dir, int minutes_ago) {
    fs::last_write_time(dir, fs::file_time_type::clock::now() - std::chrono::minutes(minutes_ago));
  }
  std::string resolve_error(const std::string& arg) {
    std::string err = test::error_of([&] { resolve_model_path(arg); });
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    return err;
  }

  static constexpr const char* kVars[] = {"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"};
  test::TempDir tmp_;
  fs::path cwd_;
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

TEST_F(ModelPath, LocalFolderWithConfig) {
  std::string m = tmp_ / "my-model";
  test::write_bytes(m + "/config.json", "{}");
  EXPECT_EQ(resolve_model_path(m), m);
  EXPECT_EQ(resolve_model_path(test::kShared + "/models/stories260K"), test::kShared + "/models/stories260K");
  test::write_bytes(tmp_ / "home/models/x/config.json", "{}");
  EXPECT_EQ(resolve_model_path("~/models/x"), tmp_ / "home/models/x");
}

TEST_F(ModelPath, NonexistentPathListsWhereItLooked) {
  setenv("HF_HOME", (tmp_ / "hf").c_str(), 1);
  std::string err = resolve_error("kiln-test-org/no-such-model");
  EXPECT_THAT(err, StartsWith("[model] cannot find model \"kiln-test-org/no-such-model\": looked at "));
  EXPECT_THAT(err, HasSubstr("kiln-test-org/no-such-model (no such folder)"));
  EXPECT_THAT(err, HasSubstr(tmp_ / "hf/hub/models--kiln-test-org--no-such-model/snapshots (not there)"));
  EXPECT_THAT(err, HasSubstr(tmp_ / "home/.cache/huggingface/hub/models--kiln-test-org--no-such-model/snapshots (not there)"));

  // A path that cannot be a repo id is only looked for locally.
  std::string abs = tmp_ / "nowhere/model";
  err = resolve_error(abs);
  EXPECT_THAT(err, HasSubstr(abs + " (no such folder)"));
  EXPECT_THAT(err, HasSubstr("not a Hugging Face repo id"));
}

TEST_F(ModelPath, FolderWithoutConfigOrAFile) {
  fs::create_directories(tmp_ / "empty");
  EXPECT_THAT(resolve_error(tmp_ / "empty"), HasSubstr(tmp_ / "empty (folder without config.json)"));
  test::write_bytes(tmp_ / "weights.bin", "x");
  EXPECT_THAT(resolve_error(tmp_ / "weights.bin"), HasSubstr(tmp_ / "weights.bin (a file, not a folder)"));
  EXPECT_THAT(resolve_error(""), StartsWith("[model] empty model argument"));
}

TEST_F(ModelPath, HfCacheRefsMainWins) {
  std::string hub = tmp_ / "hf/hub";
  setenv("HF_HOME", (tmp_ / "hf").c_str(), 1);
  std::string older = make_snapshot(hub, "models--org--name", "1111aaaa");
  std::string newer = make_snapshot(hub, "models--org--name", "2222bbbb");
  set_age(older, 60);
  set_age(newer, 1);
  test::write_bytes(hub + "/models--org--name/refs/main", "1111aaaa\n");
  EXPECT_EQ(resolve_model_path("org/name"), older);
  // A ref to a snapshot that is not there falls back to the newest.
  test::write_bytes(hub + "/models--org--name/refs/main", "3333cccc");
  EXPECT_EQ(resolve_model_path("org/name"), newer);
}

TEST_F(ModelPath, HfCacheNewestSnapshotWithConfig) {
  std::string hub = tmp_ / "hf/hub";
  setenv("HF_HOME", (tmp_ / "hf").c_str(), 1);
  std::string a = make_snapshot(hub, "models--org--name", "aaaa");
  std::string b = make_snapshot(hub, "models--org--name", "bbbb");
  std::string c = make_snapshot(hub, "models--org--name", "cccc", /*config=*/false);  // incomplete download
  set_age(a, 5);
  set_age(b, 30);
  set_age(c, 0);
  EXPECT_EQ(resolve_model_path("org/name"), a);
  set_age(b, 1);
  EXPECT_EQ(resolve_model_path("org/name"), b);
  // Legacy ids without an org map to models--NAME.
  std::string gpt = make_snapshot(hub, "models--gpt2", "abcd");
  EXPECT_EQ(resolve_model_path("gpt2"), gpt);

  fs::remove(a + "/config.json");
  fs::remove(b + "/config.json");
  EXPECT_THAT(resolve_error("org/name"), HasSubstr(hub + "/models--org--name/snapshots (no snapshot with config.json)"));
}

TEST_F(ModelPath, HubCacheTakesPrecedence) {
  setenv("HF_HUB_CACHE", (tmp_ / "hubcache").c_str(), 1);
  setenv("HF_HOME", (tmp_ / "hf").c_str(), 1);
  setenv("XDG_CACHE_HOME", (tmp_ / "xdg").c_str(), 1);
  EXPECT_EQ(hf_hub_cache_dirs(), (std::vector<std::string>{tmp_ / "hubcache", tmp_ / "hf/hub", tmp_ / "xdg/huggingface/hub",
                                                           tmp_ / "home/.cache/huggingface/hub"}));
  std::string in_home = make_snapshot(tmp_ / "home/.cache/huggingface/hub", "models--org--name", "r1");
  EXPECT_EQ(resolve_model_path("org/name"), in_home);
  std::string in_hf = make_snapshot(tmp_ / "hf/hub", "models--org--name", "r2");
  EXPECT_EQ(resolve_model_path("org/name"), in_hf);
  std::string in_hub = make_snapshot(tmp_ / "hubcache", "models--org--name", "r3");
  EXPECT_EQ(resolve_model_path("org/name"), in_hub);

  // Duplicates collapse: HF_HUB_CACHE equal to $HF_HOME/hub is searched once.
  setenv("HF_HUB_CACHE", (tmp_ / "hf/hub/").c_str(), 1);
  EXPECT_EQ(hf_hub_cache_dirs().size(), 3u);
}

TEST_F(ModelPath, LocalFolderBeforeCache) {
  setenv("HF_HOME", (tmp_ / "hf").c_str(), 1);
  make_snapshot(tmp_ / "hf/hub", "models--org--name", "r1");
  fs::create_directories(tmp_ / "work/org/name");
  test::write_bytes(tmp_ / "work/org/name/config.json", "{}");
  fs::current_path(tmp_ / "work");
  EXPECT_EQ(resolve_model_path("org/name"), "org/name");
}

}  // namespace
}  // namespace kiln::io
