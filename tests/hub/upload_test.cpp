// kiln upload against the mock Hub: a kiln-converted (quantized) folder uploaded and pulled back byte
// for byte (basic and multipart LFS transfers, the generated model card), LFS objects the Hub has are
// not sent again, 500s mid-upload are retried, a failed upload commits nothing, and token errors are clear.
#include <gmock/gmock.h>
#include <stdlib.h>

#include "../cli/cli_util.h"
#include "hub_test_util.h"
#include "kiln/hub/pull.h"
#include "kiln/hub/upload.h"

namespace kiln::hubtest {
namespace {

using ::testing::HasSubstr;
const std::string kRepo = "kiln-test/stories260K-4bit";

// stories260K converted by `kiln convert -q` (4-bit, group 64) into dir, plus a nested text file,
// a small second weights file (a basic LFS transfer) and the quality figures the card reads.
void make_converted_folder(const TempDir& dir) {
  test::RunResult r = test::run_kiln({"convert", "--hf-path", std::string(KILN_SHARED_DIR) + "/models/stories260K",
                                      "--mlx-path", dir / "m", "-q", "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  io::test::write_bytes(dir / "m/extra/notes.txt", "converted for the hub tests\n");
  io::test::write_bytes(dir / "m/extra/adapter.safetensors", std::string(3000, '\x07'));
  io::test::write_bytes(dir / "m/kiln_eval.json",
                        R"({"perplexity": 12.3456, "perplexity_se": 0.21, "kl_mean": 0.0123, "kl_p99": 0.25, "dataset": "tinystories"})");
}

std::map<std::string, std::string> folder_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().lexically_relative(dir).string()] = slurp(e.path().string());
  return out;
}

class UploadTest : public HubTest {
 protected:
  void SetUp() override {
    HubTest::SetUp();
    make_converted_folder(work);
    std::lock_guard<std::mutex> g(hub.mu());
    hub.required_token = "hf_write";
    hub.multipart_threshold = 100 << 10;  // the quantized weights (~0.4 MB) go in parts
    hub.chunk_size = 64 << 10;
    cfg.token = "hf_write";
    cfg.token_source = "$HF_TOKEN";
    opt.path = work / "m";
    opt.repo = kRepo;
    opt.base_model = "kiln-test/stories260K";
  }
  hub::PullResult pull_back() {
    hub::PullOptions p;
    p.repo = kRepo;
    p.include = {"*"};
    return hub::pull(p, cfg);
  }
  TempDir work;
  hub::UploadOptions opt;
};

TEST_F(UploadTest, UploadThenPullRoundTripsTheFolderByteForByte) {
  hub::UploadResult r = hub::upload(opt, cfg);
  EXPECT_TRUE(r.created_repo);
  EXPECT_TRUE(r.generated_card);
  EXPECT_EQ(r.lfs_files, 2u);
  EXPECT_EQ(r.lfs_uploaded, 2u);
  const auto local = folder_files(opt.path);
  EXPECT_EQ(r.files, local.size() + 1);  // + README.md
  const uint64_t weights = local.at("model.safetensors").size();
  EXPECT_EQ(hub.count_requests("PUT /lfs-part/"), static_cast<int>((weights + (64 << 10) - 1) / (64 << 10)));
  EXPECT_EQ(hub.count_requests("POST /lfs-complete/"), 1);
  EXPECT_EQ(hub.count_requests("PUT /lfs-upload/"), 1) << "the small weights file: basic";
  EXPECT_EQ(hub.count_requests("/commit/"), 1);
  // On the Hub: the initial .gitattributes, the folder, the card; weights in LFS.
  MockTree t = hub.tree(kRepo, "main");
  EXPECT_EQ(t.size(), local.size() + 2);
  EXPECT_TRUE(t.at("model.safetensors").lfs);
  EXPECT_FALSE(t.at("config.json").lfs);

  hub::PullResult p = pull_back();
  EXPECT_EQ(p.commit, r.commit);
  for (const auto& [path, bytes] : local) EXPECT_EQ(slurp(p.snapshot + "/" + path), bytes) << path;
  const std::string card = slurp(p.snapshot + "/README.md");
  EXPECT_THAT(card, HasSubstr("library_name: mlx\nbase_model: kiln-test/stories260K\n"));
  EXPECT_THAT(card, HasSubstr("using kiln version 0.1.0"));
  EXPECT_THAT(card, HasSubstr("| 4 | 64 | affine | 0 |"));
  EXPECT_THAT(card, HasSubstr("| 12.35 | 0.21 | 0.0123 | 0.25 |"));
  EXPECT_THAT(card, HasSubstr("kiln pull " + kRepo));
}

TEST_F(UploadTest, ASecondUploadSendsNoLfsObjectTheHubHasAndKeepsAnExistingCard) {
  hub::upload(opt, cfg);
  io::test::write_bytes(opt.path + "/README.md", "# my own card\n");
  hub::UploadResult r = hub::upload(opt, cfg);
  EXPECT_FALSE(r.created_repo) << "409: it exists";
  EXPECT_FALSE(r.generated_card);
  EXPECT_EQ(r.lfs_uploaded, 0u);
  EXPECT_EQ(hub.count_requests("PUT /lfs-"), static_cast<int>(hub.count_requests("PUT /lfs-part/") + 1));
  EXPECT_EQ(hub.tree(kRepo, "main").at("README.md").content, "# my own card\n");
}

TEST_F(UploadTest, ARevisionOtherThanMainIsABranchMadeFromMain) {
  hub::upload(opt, cfg);
  io::test::write_bytes(opt.path + "/extra/notes.txt", "a second version\n");
  opt.revision = "v2";
  opt.commit_message = "second";
  hub::UploadResult r = hub::upload(opt, cfg);
  EXPECT_EQ(hub.tree(kRepo, "v2").at("extra/notes.txt").content, "a second version\n");
  EXPECT_EQ(hub.tree(kRepo, "main").at("extra/notes.txt").content, "converted for the hub tests\n");
  hub::PullOptions p;
  p.repo = kRepo;
  p.revision = "v2";
  p.include = {"extra/"};
  hub::PullResult back = hub::pull(p, cfg);
  EXPECT_EQ(back.commit, r.commit);
  EXPECT_EQ(slurp(back.snapshot + "/extra/notes.txt"), "a second version\n");
  hub::upload(opt, cfg);  // the branch exists now: 409, and the commit goes on it
  EXPECT_EQ(hub.count_requests("/branch/v2"), 2);
}

TEST_F(UploadTest, FiveHundredsMidUploadAreRetried) {
  {
    std::lock_guard<std::mutex> g(hub.mu());
    hub.fail_500 = {{"PUT /lfs-part/", 2}, {"PUT /lfs-upload/", 1}, {"/preupload/", 1}, {"/objects/batch", 1},
                    {"/lfs-complete/", 1}, {"/commit/", 1}, {"/api/repos/create", 1}};
  }
  hub::UploadResult r = hub::upload(opt, cfg);
  hub::PullResult p = pull_back();
  for (const auto& [path, bytes] : folder_files(opt.path)) EXPECT_EQ(slurp(p.snapshot + "/" + path), bytes) << path;
  std::lock_guard<std::mutex> g(hub.mu());
  for (const auto& [k, left] : hub.fail_500) EXPECT_EQ(left, 0) << k;
  EXPECT_EQ(hub.commits_made, 1);
}

TEST_F(UploadTest, AFailedUploadCommitsNothing) {
  {
    std::lock_guard<std::mutex> g(hub.mu());
    hub.fail_500 = {{"PUT /lfs-part/", 1000}};
  }
  cfg.retry.max_retries = 2;
  std::string err = error_of([&] { hub::upload(opt, cfg); });
  EXPECT_THAT(err, HasSubstr("model.safetensors (LFS part 1): HTTP 500"));
  {
    std::lock_guard<std::mutex> g(hub.mu());
    EXPECT_EQ(hub.commits_made, 0);
    hub.fail_500.clear();
  }
  MockTree t = hub.tree(kRepo, "main");
  EXPECT_EQ(t.size(), 1u) << "the repo holds only its initial .gitattributes";
  EXPECT_EQ(hub.count_requests("/commit/"), 0);
  // The next upload completes the job.
  hub::upload(opt, cfg);
  EXPECT_EQ(hub.tree(kRepo, "main").size(), folder_files(opt.path).size() + 2);
}

TEST_F(UploadTest, TokenErrorsAreClear) {
  cfg.token.clear();
  std::string err = error_of([&] { hub::upload(opt, cfg); });
  EXPECT_THAT(err, HasSubstr("[hub] uploading needs a token with write access: pass --token, set HF_TOKEN"));
  EXPECT_EQ(hub.count_requests(""), 0) << "no request without a token";
  cfg.token = "hf_read_only";
  err = error_of([&] { hub::upload(opt, cfg); });
  EXPECT_THAT(err, HasSubstr("kiln-test/stories260K-4bit (creating the repo): 401 unauthorized"));
  EXPECT_THAT(err, HasSubstr("the token from $HF_TOKEN was sent"));
  EXPECT_FALSE(hub.has_repo(kRepo));
}

// The binary: kiln upload with HF_ENDPOINT and HF_TOKEN, then kiln pull of what it made.
TEST_F(UploadTest, KilnUploadCommandLine) {
  setenv("HF_ENDPOINT", hub.endpoint().c_str(), 1);
  setenv("HF_TOKEN", "hf_write", 1);
  setenv("HF_HUB_CACHE", cache.path().c_str(), 1);
  test::RunResult u = test::run_kiln({"upload", "--path", opt.path, "--upload-repo", kRepo, "--commit-message", "first"});
  EXPECT_EQ(u.exit_code, 0) << u.err;
  EXPECT_THAT(u.out, HasSubstr(hub.endpoint() + "/" + kRepo + "/commit/"));
  test::RunResult p = test::run_kiln({"pull", kRepo, "-q"});
  EXPECT_EQ(p.exit_code, 0) << p.err;
  test::RunResult g = test::run_kiln({"generate", "--model", kRepo, "-m", "4", "--device", "cpu", "--temp", "0"});
  EXPECT_EQ(g.exit_code, 0) << g.err;
  unsetenv("HF_TOKEN");
  setenv("HF_TOKEN_PATH", (work / "no-token-file").c_str(), 1);
  test::RunResult bad = test::run_kiln({"upload", "--path", opt.path, "--upload-repo", kRepo});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("kiln: [hub] uploading needs a token"));
  for (const char* v : {"HF_ENDPOINT", "HF_HUB_CACHE", "HF_TOKEN_PATH"}) unsetenv(v);
}

}  // namespace
}  // namespace kiln::hubtest
