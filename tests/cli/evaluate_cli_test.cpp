// kiln evaluate end to end: a run on the real fixtures writes lm-eval's results JSON; bad input
// (an unknown task, a missing data file, malformed rows with and without --strict) gives messages
// that say what to do.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_util.h"
#include "kiln/base/json.h"

using namespace kiln;
using kiln::test::run_kiln;

namespace {
const std::string kShared = KILN_SHARED_DIR;
const std::string kModel = kShared + "/models/stories260K";
const std::string kData = kShared + "/fixtures/eval";
}  // namespace

TEST(EvaluateCli, WritesLmEvalResults) {
  const std::string out = test::make_temp_dir("kiln_evaluate_out");
  auto r = run_kiln({"evaluate", "--model", kModel, "--tasks", "arc_easy", "winogrande", "--limit", "20", "--data-dir", kData,
                     "--output-dir", out, "--evals-db", out + "/evals.sqlite"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("|arc_easy"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("req/s"), std::string::npos);  // the progress bar
  const std::string path = out + "/eval_stories260K_arc_easy_winogrande.json";
  ASSERT_TRUE(std::filesystem::exists(path)) << r.out;
  const Json j = read_json_file(path);
  for (const char* k : {"results", "versions", "n-shot", "n-samples", "config"}) EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_TRUE(j["results"]["arc_easy"].contains("acc,none"));
  EXPECT_TRUE(j["results"]["arc_easy"].contains("acc_norm_stderr,none"));
  EXPECT_EQ(j["n-samples"]["winogrande"]["effective"], 20);
  EXPECT_EQ(j["n-shot"]["arc_easy"], 0);
  EXPECT_EQ(j["config"]["seed"], 123);
  EXPECT_EQ(j["config"]["batch_size"], 16);
  // The run is in the evals database: listed, as a task table, and compared with a second run.
  EXPECT_NE(r.out.find("Recorded as run 1"), std::string::npos) << r.out;
  r = run_kiln({"evaluate", "--model", kShared + "/models/tiny-llama", "--tasks", "arc_easy", "--limit", "20",
                "--data-dir", kData, "--output-dir", out, "--evals-db", out + "/evals.sqlite"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_kiln({"evals", "--evals-db", out + "/evals.sqlite", "--task", "arc_easy"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| 2 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tiny-llama"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("acc_norm"), std::string::npos) << r.out;
  r = run_kiln({"evals", "--evals-db", out + "/evals.sqlite", "--task", "winogrande"});
  EXPECT_EQ(r.out.find("tiny-llama"), std::string::npos) << r.out;  // run 2 has no winogrande
  r = run_kiln({"evals", "--evals-db", out + "/evals.sqlite", "--compare", "1", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| arc_easy | acc |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("winogrande"), std::string::npos) << r.out;  // only the metrics both runs have
  r = run_kiln({"evals", "--evals-db", out + "/evals.sqlite", "--compare", "1", "7"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no run 7"), std::string::npos) << r.err;
  std::filesystem::remove_all(out);
}

TEST(EvaluateCli, BadInput) {
  auto r = run_kiln({"evaluate", "--model", kModel, "--tasks", "helaswag", "--data-dir", kData});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown task \"helaswag\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hellaswag"), std::string::npos) << r.err;  // the known tasks are listed

  const std::string dir = test::make_temp_dir("kiln_evaluate_data");
  r = run_kiln({"evaluate", "--model", kModel, "--tasks", "winogrande", "--data-dir", dir});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("winogrande/dev.jsonl"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(dir), std::string::npos) << r.err;

  std::filesystem::create_directories(dir + "/winogrande");
  std::ofstream(dir + "/winogrande/dev.jsonl")
      << R"({"qID": "a", "sentence": "Tom gave Sam a ball because _ was kind.", "option1": "Tom", "option2": "Sam", "answer": "1"})"
      << "\n{\"broken\n"
      << R"({"qID": "b", "sentence": "no blank here", "option1": "x", "option2": "y", "answer": "1"})" << "\n";
  r = run_kiln({"evaluate", "--model", kModel, "--tasks", "winogrande", "--data-dir", dir, "--output-dir", dir, "--no-evals-db"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("skipped 2 malformed rows"), std::string::npos) << r.err;
  r = run_kiln({"evaluate", "--model", kModel, "--tasks", "winogrande", "--data-dir", dir, "--strict"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("dev.jsonl:2"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

// A model with a chat template: prompts go through it by default (mlx_lm.evaluate's default), not
// under --no-apply-chat-template; --fewshot-as-multiturn puts the examples in assistant turns.
TEST(EvaluateCli, ChatTemplateByDefault) {
  namespace fs = std::filesystem;
  const std::string dir = test::make_temp_dir("kiln_evaluate_chat");
  const std::string model = dir + "/qchat";
  fs::copy(kShared + "/models/tiny-qwen2", model, fs::copy_options::recursive);
  Json cfg = read_json_file(model + "/tokenizer_config.json");
  cfg["chat_template"] =
      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  std::ofstream(model + "/tokenizer_config.json") << cfg.dump();
  auto first_context = [&](const std::string& task) {
    std::ifstream f(dir + "/samples_qchat_" + task + ".jsonl");
    std::string line;
    std::getline(f, line);
    return Json::parse(line)["arguments"][0][0].get<std::string>();
  };
  auto r = run_kiln({"evaluate", "--model", model, "--tasks", "arc_easy", "--limit", "2", "--log-samples", "--data-dir", kData,
                     "--output-dir", dir, "--no-evals-db"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(first_context("arc_easy").rfind("<|im_start|>user\nQuestion: ", 0), 0u) << first_context("arc_easy");
  r = run_kiln({"evaluate", "--model", model, "--tasks", "arc_easy", "--limit", "2", "--log-samples", "--data-dir", kData,
                "--output-dir", dir, "--no-evals-db", "--no-apply-chat-template"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(first_context("arc_easy").rfind("Question: ", 0), 0u);
  r = run_kiln({"evaluate", "--model", model, "--tasks", "mmlu_marketing", "--num-shots", "1", "--fewshot-as-multiturn",
                "--limit", "1", "--log-samples", "--data-dir", kData, "--output-dir", dir, "--no-evals-db"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string c = first_context("mmlu_marketing");
  EXPECT_NE(c.find("<|im_start|>system\nThe following are multiple choice questions (with answers) about marketing."), std::string::npos) << c;
  EXPECT_NE(c.find("Answer:<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\n"), std::string::npos) << c;
  fs::remove_all(dir);
}
