// The evals database: a recorded run reads back field for field; runs filter by task and model;
// compare() pairs the metrics both runs have and flags a delta beyond 2 * sqrt(se_a^2 + se_b^2).
#include <gtest/gtest.h>

#include <filesystem>

#include "kiln/eval/evals_db.h"

using namespace kiln;

namespace {

eval::TaskResult result(const std::string& task, double acc, double se) {
  eval::TaskResult r;
  r.name = task;
  r.shots = 5;
  r.n_docs = 100;
  r.metrics.push_back({"acc", "none", acc, true, se});
  r.metrics.push_back({"word_perplexity", "none", 12.5, false, 0});
  return r;
}

}  // namespace

TEST(EvalsDb, RecordListCompare) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kiln_evals_db_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string path = (dir / "sub" / "evals.sqlite").string();  // the folder is created
  int64_t a = 0, b = 0;
  {
    eval::EvalsDb db(path);
    eval::RunInfo info;
    info.date = "2026-12-04T00:00:00Z";
    info.model_path = "/models/llama-8b";
    info.model_hash = "00ff";
    info.quantization = R"({"bits":4,"group_size":64})";
    info.device = "cuda";
    info.machine = "box (x86_64, cuda)";
    info.kiln_version = "git-abc";
    info.limit = 200;
    info.seed = 123;
    info.batch_size = 16;
    info.config_json = "{}";
    a = db.record(info, {result("hellaswag", 0.50, 0.01), result("piqa", 0.70, 0.01)});
    info.model_path = "/models/llama-8b-q4";
    b = db.record(info, {result("hellaswag", 0.53, 0.01)});
  }
  eval::EvalsDb db(path);  // reopened: it persisted
  const auto all = db.runs();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id, b);  // newest first
  const auto ra = db.run(a);
  EXPECT_EQ(ra.info.model_path, "/models/llama-8b");
  EXPECT_EQ(ra.info.quantization, R"({"bits":4,"group_size":64})");
  EXPECT_EQ(ra.info.seed, 123u);
  EXPECT_EQ(ra.info.limit, 200);
  ASSERT_EQ(ra.tasks.size(), 2u);
  EXPECT_EQ(ra.tasks[1].task, "piqa");
  EXPECT_EQ(ra.tasks[1].n_shot, 5);
  ASSERT_EQ(ra.metrics.size(), 4u);
  EXPECT_FALSE(ra.metrics[1].stderr_.has_value());  // word_perplexity has none
  EXPECT_EQ(db.runs("piqa").size(), 1u);
  EXPECT_EQ(db.runs("hellaswag")[0].metrics.size(), 2u);  // only that task's metrics
  EXPECT_EQ(db.runs("", "q4").size(), 1u);
  EXPECT_THROW(db.run(99), Error);
  // 0.53 - 0.50 = 0.03 > 2 * sqrt(2) * 0.01 = 0.0283: significant; the piqa metrics are A's only.
  const auto c = eval::compare(ra, db.run(b));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].metric, "acc");
  EXPECT_NEAR(c[0].delta, 0.03, 1e-12);
  EXPECT_TRUE(c[0].significant);
  EXPECT_FALSE(c[1].significant);  // no standard errors
  auto rb = db.run(b);
  rb.metrics[0].value = 0.52;  // 0.02 < 0.0283
  EXPECT_FALSE(eval::compare(ra, rb)[0].significant);
  fs::remove_all(dir);
}
