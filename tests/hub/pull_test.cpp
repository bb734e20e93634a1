// kiln pull against the mock Hub: the round trip byte for byte, the HF cache layout file by file
// (huggingface_hub's file_download rules), resume after an interrupted pull (counting what the mock
// served), retries on 500s and truncated transfers, wrong hashes leaving nothing behind, 401/403/404
// messages, offline mode, globs, token discovery, and `kiln generate --model ORG/NAME` after a pull.
#include <gmock/gmock.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "../cli/cli_util.h"
#include "hub_test_util.h"
#include "kiln/hub/cache.h"
#include "kiln/hub/pull.h"
#include "kiln/io/model_path.h"

namespace kiln::hubtest {
namespace {

using ::testing::HasSubstr;
const std::string kRepo = "kiln-test/stories260K";
const std::vector<std::string> kDefaultFiles = {"config.json", "generation_config.json", "tokenizer.json",
                                                "tokenizer_config.json", "model.safetensors",
                                                "extra/nested/chat_template.jinja"};

hub::PullResult pull(const hub::HubConfig& cfg, const std::string& revision = "main",
                     std::vector<std::string> include = {}) {
  hub::PullOptions o;
  o.repo = kRepo;
  o.revision = revision;
  o.include = std::move(include);
  return hub::pull(o, cfg);
}

// Every file under root, relative ("blobs/x", "snapshots/c/y"), with ".incomplete" ones included.
std::set<std::string> listing(const std::string& root) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator(); ++it)
    if (!it->is_directory(ec) || it->is_symlink(ec)) out.insert(it->path().lexically_relative(root).string());
  return out;
}

TEST_F(HubTest, PullRoundTripsByteForByteWithTheDefaultPatterns) {
  const MockTree t = stories_tree();
  const std::string commit = hub.add_commit(kRepo, "main", t);
  hub::PullResult r = pull(cfg);
  EXPECT_EQ(r.commit, commit);
  EXPECT_EQ(r.files, kDefaultFiles.size());
  EXPECT_EQ(r.files_downloaded, kDefaultFiles.size());
  uint64_t total = 0;
  for (const auto& f : kDefaultFiles) {
    EXPECT_EQ(slurp(r.snapshot + "/" + f), t.at(f).content) << f;
    total += t.at(f).content.size();
  }
  EXPECT_EQ(r.bytes_downloaded, total);
  EXPECT_FALSE(fs::exists(r.snapshot + "/README.md")) << "not in the default patterns";
  // The tree listing is paged (3 entries a page): every page was read.
  EXPECT_GE(hub.count_requests("/tree/"), 3);
}

TEST_F(HubTest, CacheLayoutFollowsHuggingFaceHubsRules) {
  const MockTree t = stories_tree();
  const std::string commit = hub.add_commit(kRepo, "main", t);
  hub::PullResult r = pull(cfg, "main", {"*"});
  const std::string root = cache.path() + "/models--kiln-test--stories260K";
  EXPECT_EQ(r.snapshot, root + "/snapshots/" + commit);
  // refs/main: the commit, no newline.
  EXPECT_EQ(slurp(root + "/refs/main"), commit);
  std::set<std::string> expect = {"refs/main"};
  for (const auto& [path, f] : t) {
    // blobs/<etag>: the LFS sha256 for LFS files, git's blob sha1 for the others.
    const std::string etag = f.lfs ? sha256_hex(f.content) : git_blob_hex(f.content);
    expect.insert("blobs/" + etag);
    expect.insert("snapshots/" + commit + "/" + path);
    EXPECT_EQ(slurp(root + "/blobs/" + etag), f.content) << path;
    // snapshots/<commit>/<path>: a relative symlink, one more ../ per folder of the path.
    const fs::path ptr = root + "/snapshots/" + commit + "/" + path;
    ASSERT_TRUE(fs::is_symlink(ptr)) << path;
    std::string up = "../../";
    for (char c : path)
      if (c == '/') up += "../";
    EXPECT_EQ(fs::read_symlink(ptr).string(), up + "blobs/" + etag) << path;
    EXPECT_EQ(fs::canonical(ptr), fs::canonical(root + "/blobs/" + etag));
  }
  EXPECT_EQ(listing(root), expect) << "nothing else (no .incomplete) in the repo folder";
  EXPECT_TRUE(fs::is_directory(cache.path() + "/.locks/models--kiln-test--stories260K"));
  EXPECT_THAT(slurp(cache.path() + "/CACHEDIR.TAG"), ::testing::StartsWith("Signature: 8a477f597d28d172789f06886806bc55"));
  // kiln's model resolution finds the snapshot through refs/main.
  setenv("HF_HUB_CACHE", cache.path().c_str(), 1);
  EXPECT_EQ(io::resolve_model_path(kRepo), r.snapshot);
  unsetenv("HF_HUB_CACHE");
}

TEST_F(HubTest, ASecondPullDownloadsNothing) {
  hub.add_commit(kRepo, "main", stories_tree());
  pull(cfg);
  const int resolves = hub.count_requests("/resolve/");
  hub::PullResult r = pull(cfg);
  EXPECT_EQ(r.files_downloaded, 0u);
  EXPECT_EQ(r.bytes_downloaded, 0u);
  EXPECT_EQ(hub.count_requests("/resolve/"), resolves);
}

TEST_F(HubTest, AnInterruptedPullResumesWithoutRefetchingFinishedFiles) {
  const MockTree t = stories_tree();
  hub.add_commit(kRepo, "main", t);
  const std::string& weights = t.at("model.safetensors").content;
  const uint64_t cut = weights.size() / 2 + 12345;
  {
    std::lock_guard<std::mutex> g(hub.mu());
    hub.truncate["model.safetensors"] = {cut, 1};
  }
  cfg.retry.max_retries = 0;  // the first break kills the pull
  std::string err = error_of([&] { pull(cfg); });
  EXPECT_THAT(err, HasSubstr("model.safetensors: the download broke off at"));
  EXPECT_THAT(err, HasSubstr("run kiln pull again to resume"));
  const std::string root = cache.path() + "/models--kiln-test--stories260K";
  const std::string part = root + "/blobs/" + sha256_hex(weights) + ".incomplete";
  ASSERT_TRUE(fs::exists(part));
  EXPECT_EQ(fs::file_size(part), cut);
  std::map<std::string, uint64_t> served_before;
  {
    std::lock_guard<std::mutex> g(hub.mu());
    served_before = hub.served;
  }
  for (const auto& f : kDefaultFiles) {
    if (f == "model.safetensors") continue;
    EXPECT_EQ(served_before[f], t.at(f).content.size()) << f << " finished in the first pull";
  }
  // The second pull: only the rest of the weights travel.
  hub::PullResult r = pull(cfg);
  EXPECT_EQ(r.files_downloaded, 1u);
  EXPECT_EQ(r.bytes_downloaded, weights.size() - cut);
  std::lock_guard<std::mutex> g(hub.mu());
  for (const auto& f : kDefaultFiles) {
    uint64_t again = hub.served[f] - served_before[f];
    EXPECT_EQ(again, f == "model.safetensors" ? weights.size() - cut : 0u) << f;
  }
  EXPECT_EQ(slurp(r.snapshot + "/model.safetensors"), weights);
  EXPECT_FALSE(fs::exists(part));
}

// A `kiln pull` process killed (SIGKILL) in the middle of the weights: the next pull fetches only the
// files the killed one had not linked, and of the weights only the bytes its .incomplete file lacks.
TEST_F(HubTest, AKilledPullProcessResumes) {
  const MockTree t = stories_tree();
  const std::string commit = hub.add_commit(kRepo, "main", t);
  const std::string& weights = t.at("model.safetensors").content;
  const uint64_t stall_at = 600000;
  {
    std::lock_guard<std::mutex> g(hub.mu());
    hub.stall["model.safetensors"] = stall_at;
  }
  setenv("HF_ENDPOINT", hub.endpoint().c_str(), 1);
  setenv("HF_HUB_CACHE", cache.path().c_str(), 1);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execl(KILN_BIN, KILN_BIN, "pull", kRepo.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until the weights hang at the stall and the small files are linked, then kill.
  const std::string root = cache.path() + "/models--kiln-test--stories260K";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto small_files_linked = [&] {
    for (const auto& f : kDefaultFiles)
      if (f != "model.safetensors" && !fs::exists(root + "/snapshots/" + commit + "/" + f)) return false;
    return true;
  };
  while (std::chrono::steady_clock::now() < deadline) {
    uint64_t served;
    {
      std::lock_guard<std::mutex> g(hub.mu());
      served = hub.served["model.safetensors"];
    }
    if (served >= stall_at && small_files_linked()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  unsetenv("HF_ENDPOINT");
  unsetenv("HF_HUB_CACHE");
  std::map<std::string, uint64_t> served_before;
  {
    std::lock_guard<std::mutex> g(hub.mu());
    hub.stall.clear();
    served_before = hub.served;
  }
  EXPECT_EQ(served_before["model.safetensors"], stall_at);
  const std::string part = root + "/blobs/" + sha256_hex(weights) + ".incomplete";
  ASSERT_TRUE(fs::exists(part));
  const uint64_t kept = fs::file_size(part);  // what reached the disk before the kill (stdio buffers lost)
  EXPECT_LE(kept, stall_at);
  EXPECT_GT(kept, stall_at / 2);
  ASSERT_TRUE(small_files_linked());
  hub::PullResult r = pull(cfg);
  EXPECT_EQ(r.files_downloaded, 1u);
  EXPECT_EQ(r.bytes_downloaded, weights.size() - kept);
  std::lock_guard<std::mutex> g(hub.mu());
  for (const auto& f : kDefaultFiles)
    EXPECT_EQ(hub.served[f] - served_before[f], f == "model.safetensors" ? weights.size() - kept : 0u) << f;
  EXPECT_EQ(slurp(r.snapshot + "/model.safetensors"), weights);
}

TEST_F(HubTest, RetriesResumeATruncatedTransferAndSurvive500s) {
  const MockTree t = stories_tree();
  hub.add_commit(kRepo, "main", t);
  const std::string& weights = t.at("model.safetensors").content;
  {
    std::lock_guard<std::mutex> g(hub.mu());
    hub.truncate["model.safetensors"] = {weights.size() / 3, 2};  // cut twice at the same place
    hub.fail_500["GET /kiln-test/stories260K/resolve/"] = 2;
    hub.fail_500["/tree/"] = 1;
    hub.fail_500["/revision/"] = 1;
  }
  hub::PullResult r = pull(cfg);
  EXPECT_EQ(slurp(r.snapshot + "/model.safetensors"), weights);
  std::lock_guard<std::mutex> g(hub.mu());
  EXPECT_EQ(hub.served["model.safetensors"], weights.size()) << "the resumed transfers sent each byte once";
  for (const auto& [k, left] : hub.fail_500) EXPECT_EQ(left, 0) << k;
}

TEST_F(HubTest, AWrongHashLeavesNothingInTheCache) {
  const MockTree t = stories_tree();
  const std::string commit = hub.add_commit(kRepo, "main", t);
  const std::string root = cache.path() + "/models--kiln-test--stories260K";
  for (const std::string f : {"model.safetensors", "config.json"}) {
    {
      std::lock_guard<std::mutex> g(hub.mu());
      hub.corrupt = {f};
    }
    std::string err = error_of([&] { pull(cfg, "main", {f}); });
    EXPECT_THAT(err, HasSubstr(f + ": the downloaded bytes' " + (t.at(f).lfs ? "sha256" : "git blob sha1")));
    EXPECT_THAT(err, HasSubstr("the download was deleted"));
    const std::string etag = t.at(f).lfs ? sha256_hex(t.at(f).content) : git_blob_hex(t.at(f).content);
    EXPECT_FALSE(fs::exists(root + "/blobs/" + etag)) << f;
    EXPECT_FALSE(fs::exists(root + "/blobs/" + etag + ".incomplete")) << f;
    EXPECT_FALSE(fs::exists(fs::symlink_status(root + "/snapshots/" + commit + "/" + f))) << f;
  }
  std::lock_guard<std::mutex> g(hub.mu());
  hub.corrupt.clear();
}

// A full disk, made with RLIMIT_FSIZE (writes past the limit fail with EFBIG): a clear message, the
// partial download kept for the resume, no blob or link for the file, and the next pull finishes it.
TEST_F(HubTest, AFullDiskIsAClearErrorAndThePullResumesLater) {
  const MockTree t = stories_tree();
  const std::string commit = hub.add_commit(kRepo, "main", t);
  const std::string& weights = t.at("model.safetensors").content;
  struct rlimit old {};
  getrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 300000;
  setrlimit(RLIMIT_FSIZE, &lim);
  std::string err = error_of([&] { pull(cfg, "main", {"model.safetensors"}); });
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_THAT(err, HasSubstr("model.safetensors: cannot write"));
  EXPECT_THAT(err, HasSubstr("(disk full?); the partial download is kept and resumes next time"));
  const std::string root = cache.path() + "/models--kiln-test--stories260K";
  EXPECT_FALSE(fs::exists(root + "/blobs/" + sha256_hex(weights)));
  EXPECT_FALSE(fs::exists(fs::symlink_status(root + "/snapshots/" + commit + "/model.safetensors")));
  EXPECT_LE(fs::file_size(root + "/blobs/" + sha256_hex(weights) + ".incomplete"), 300000u);
  hub::PullResult r = pull(cfg, "main", {"model.safetensors"});
  EXPECT_EQ(slurp(r.snapshot + "/model.safetensors"), weights);
  EXPECT_LT(r.bytes_downloaded, weights.size());
}

TEST_F(HubTest, AuthAndMissingRepoErrorsAreClear) {
  hub.add_commit(kRepo, "main", stories_tree());
  {
    std::lock_guard<std::mutex> g(hub.mu());
    hub.required_token = "hf_secret";
  }
  std::string err = error_of([&] { pull(cfg); });
  EXPECT_THAT(err, HasSubstr("[hub] kiln-test/stories260K@main: 401 unauthorized"));
  EXPECT_THAT(err, HasSubstr("no token was sent: pass --token, set HF_TOKEN"));
  cfg.token = "hf_wrong";
  cfg.token_source = "--token";
  err = error_of([&] { pull(cfg); });
  EXPECT_THAT(err, HasSubstr("401 unauthorized"));
  EXPECT_THAT(err, HasSubstr("the token from --token was sent"));
  cfg.token = "hf_secret";
  EXPECT_EQ(pull(cfg).files, kDefaultFiles.size());
  {
    std::lock_guard<std::mutex> g(hub.mu());
    hub.gated.insert(kRepo);
  }
  err = error_of([&] { pull(cfg, "v2"); });
  EXPECT_THAT(err, HasSubstr("403 forbidden: the repo is gated or private"));
  {
    std::lock_guard<std::mutex> g(hub.mu());
    hub.gated.clear();
  }
  err = error_of([&] { pull(cfg, "no-such-branch"); });
  EXPECT_THAT(err, HasSubstr("kiln-test/stories260K@no-such-branch: revision not found"));
  hub::PullOptions o;
  o.repo = "kiln-test/absent";
  err = error_of([&] { hub::pull(o, cfg); });
  EXPECT_THAT(err, HasSubstr("kiln-test/absent@main: 404 not found: no such repo"));
  // Nothing but the finished pull's files in the cache.
  EXPECT_FALSE(fs::exists(cache.path() + "/models--kiln-test--absent"));
}

TEST_F(HubTest, ARevisionIsRecordedInRefsAndOfflineModeUsesTheCache) {
  hub.add_commit(kRepo, "main", stories_tree());
  MockTree v1 = stories_tree();
  v1["config.json"].content = "{\"version\": 1}";
  const std::string c1 = hub.add_commit(kRepo, "v1", v1);
  hub::PullResult r = pull(cfg, "v1");
  EXPECT_EQ(r.commit, c1);
  EXPECT_EQ(slurp(cache.path() + "/models--kiln-test--stories260K/refs/v1"), c1);
  EXPECT_EQ(slurp(r.snapshot + "/config.json"), "{\"version\": 1}");
  // --model ORG/NAME@REV resolves through refs/REV, or a commit directly.
  setenv("HF_HUB_CACHE", cache.path().c_str(), 1);
  EXPECT_EQ(io::resolve_model_path(kRepo + "@v1"), r.snapshot);
  EXPECT_EQ(io::resolve_model_path(kRepo + "@" + c1), r.snapshot);
  EXPECT_THAT(error_of([&] { io::resolve_model_path(kRepo + "@v9"); }), HasSubstr("no snapshot of revision v9"));
  EXPECT_THAT(error_of([&] { io::resolve_model_path(kRepo + "@../../x"); }), HasSubstr("not a branch, tag or commit"));
  unsetenv("HF_HUB_CACHE");
  const int before = hub.count_requests("");
  cfg.offline = true;
  EXPECT_EQ(pull(cfg, "v1").snapshot, r.snapshot);
  EXPECT_EQ(pull(cfg, c1).snapshot, r.snapshot);
  EXPECT_EQ(hub.count_requests(""), before) << "offline: no request";
  EXPECT_THAT(error_of([&] { pull(cfg, "main"); }), HasSubstr("is not in the HF cache at"));
  EXPECT_THAT(error_of([&] { pull(cfg, "main"); }), HasSubstr("HF_HUB_OFFLINE is set"));
}

TEST(HubGlob, PatternsMatchAsHuggingFaceHubsFilter) {
  using hub::glob_match, hub::keep_path;
  EXPECT_TRUE(glob_match("*.json", "config.json"));
  EXPECT_TRUE(glob_match("*.json", "sub/dir/x.json")) << "* crosses /";
  EXPECT_TRUE(glob_match("sub/", "sub/a/b.bin")) << "a folder pattern";
  EXPECT_FALSE(glob_match("*.json", "config.jsonl"));
  EXPECT_TRUE(glob_match("model-0000[1-2]-of-*.safetensors", "model-00002-of-00004.safetensors"));
  EXPECT_TRUE(keep_path("a.bin", {}, {}));
  EXPECT_FALSE(keep_path("a.bin", {"*.json"}, {}));
  EXPECT_FALSE(keep_path("original/x.json", {"*.json"}, {"original/*"}));
  for (const char* f : {"config.json", "model.safetensors.index.json", "tokenizer.model", "chat_template.jinja",
                        "model-00001-of-00002.safetensors", "merges.txt"})
    EXPECT_TRUE(keep_path(f, hub::default_pull_patterns(), {})) << f;
  for (const char* f : {"pytorch_model.bin", "README.md", "original/consolidated.00.pth", "model.gguf"})
    EXPECT_FALSE(keep_path(f, hub::default_pull_patterns(), {})) << f;
}

TEST(HubConfig, TokenEndpointAndRepoIds) {
  TempDir home;
  setenv("HF_HOME", home.path().c_str(), 1);
  unsetenv("HF_TOKEN");
  unsetenv("HUGGING_FACE_HUB_TOKEN");
  unsetenv("HF_TOKEN_PATH");
  setenv("HF_ENDPOINT", "http://hub.example/", 1);
  setenv("HF_HUB_OFFLINE", "1", 1);
  unsetenv("HF_HUB_CACHE");
  hub::HubConfig c = hub::discover_config();
  EXPECT_EQ(c.endpoint, "http://hub.example");
  EXPECT_TRUE(c.offline);
  EXPECT_EQ(c.token, "");
  EXPECT_EQ(c.cache_dir, home.path() + "/hub");
  io::test::write_bytes(home / "token", "hf_from_file\n");
  EXPECT_EQ(hub::discover_config().token, "hf_from_file");
  EXPECT_EQ(hub::discover_config().token_source, home / "token");
  setenv("HF_TOKEN", "hf_from_env", 1);
  EXPECT_EQ(hub::discover_config().token, "hf_from_env");
  EXPECT_EQ(hub::discover_config("hf_flag", "/x").token, "hf_flag");
  EXPECT_EQ(hub::discover_config("hf_flag", "/x").cache_dir, "/x");
  for (const char* v : {"HF_HOME", "HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"}) unsetenv(v);
  EXPECT_EQ(hub::parse_repo_ref("org/name").revision, "main");
  EXPECT_EQ(hub::parse_repo_ref("org/name@refs/pr/1").revision, "refs/pr/1");
  EXPECT_EQ(hub::parse_repo_ref("org/name@v1").repo, "org/name");
  EXPECT_THAT(error_of([] { hub::parse_repo_ref("no-slash"); }), HasSubstr("expected ORG/NAME[@REVISION]"));
  EXPECT_THAT(error_of([] { hub::parse_repo_ref("a/b/c"); }), HasSubstr("expected ORG/NAME[@REVISION]"));
  EXPECT_EQ(hub::repo_folder_name("org/name"), "models--org--name");
}

// The binary end to end: kiln pull (HF_ENDPOINT, HF_HUB_CACHE), then kiln generate --model ORG/NAME.
TEST_F(HubTest, KilnPullThenGenerateFindsTheModel) {
  hub.add_commit(kRepo, "main", stories_tree());
  setenv("HF_ENDPOINT", hub.endpoint().c_str(), 1);
  setenv("HF_HUB_CACHE", cache.path().c_str(), 1);
  test::RunResult absent = test::run_kiln({"generate", "--model", kRepo, "-m", "4", "--device", "cpu"});
  EXPECT_NE(absent.exit_code, 0);
  EXPECT_THAT(absent.err, HasSubstr("run `kiln pull ORG/NAME`"));
  test::RunResult p = test::run_kiln({"pull", kRepo});
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_THAT(p.out, HasSubstr("/models--kiln-test--stories260K/snapshots/"));
  test::RunResult g = test::run_kiln({"generate", "--model", kRepo, "-m", "4", "--device", "cpu", "--temp", "0"});
  EXPECT_EQ(g.exit_code, 0) << g.err;
  test::RunResult bad = test::run_kiln({"pull", "kiln-test/absent"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("kiln: [hub] kiln-test/absent@main: 404 not found"));
  unsetenv("HF_ENDPOINT");
  unsetenv("HF_HUB_CACHE");
}

}  // namespace
}  // namespace kiln::hubtest
