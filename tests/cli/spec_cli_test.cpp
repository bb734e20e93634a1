// Speculative decoding from the command line: --draft-model (llama2xs-280K, a real model with
// stories260K's tokenizer) and --spec-ngram leave greedy output unchanged in generate and chat,
// --verbose reports the drafts, and bad drafts or flags fail with one clear line before serving.
#include <gtest/gtest.h>

#include <regex>

#include "cli_util.h"
#include "kiln/base/json.h"

using kiln::test::run_kiln;

namespace {

const std::string kShared = KILN_SHARED_DIR;
const std::string kDraft = kShared + "/models/llama2xs-280K";

std::string generate(std::vector<std::string> extra, const std::string& prompt = "", int max_tokens = 60) {
  std::vector<std::string> args = {"generate", "-m", std::to_string(max_tokens), "--prompt", prompt};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_kiln(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out;
}

void expect_one_line_error(const kiln::test::RunResult& r, const std::vector<std::string>& must_contain) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "crashed: " << r.err;
  for (auto& s : must_contain) EXPECT_NE(r.err.find(s), std::string::npos) << s << " in: " << r.err;
  EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;  // CLI11 adds "Run with --help"
}

}  // namespace

TEST(SpecGenerate, DraftsLeaveGreedyTextUnchanged) {
  const std::string plain = generate({});
  auto ref = kiln::read_json_file(kShared + "/models/stories260K/reference.json");
  EXPECT_EQ(plain, ref["bos_greedy_text"].get<std::string>() + "\n");
  EXPECT_EQ(generate({"--draft-model", kDraft}), plain);
  EXPECT_EQ(generate({"--draft-model", kDraft, "--num-draft-tokens", "16"}), plain);
  EXPECT_EQ(generate({"--spec-ngram"}), plain);
  EXPECT_EQ(generate({"--spec-ngram", "--spec-ngram-min", "1", "--spec-ngram-max", "8", "--num-draft-tokens", "8"}), plain);
  EXPECT_EQ(generate({"--draft-model", kDraft, "--spec-accept", "exact"}), plain);
  // Past the draft's context (256 < 512): drafting stops there, the text goes on the same.
  const std::string prompt = ref["prompt"].get<std::string>();
  const std::string long_plain = generate({}, prompt, 300);
  EXPECT_EQ(generate({"--draft-model", kDraft}, prompt, 300), long_plain);
  EXPECT_EQ(generate({"--spec-ngram"}, prompt, 300), long_plain);  // the story repeats itself: lookups hit
}

TEST(SpecGenerate, VerboseReportsDrafts) {
  const std::regex line(R"(\nSpeculative: (\d+) drafted, (\d+) accepted \(\d+\.\d%\), \d+\.\d\d tokens per target forward)");
  for (const char* src : {"--draft-model", "--spec-ngram"}) {
    std::vector<std::string> args = {"generate", "-m", "60", "--verbose", src};
    if (std::string(src) == "--draft-model") args.push_back(kDraft);
    auto r = run_kiln(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, line)) << r.out;
    EXPECT_LE(std::stoi(m[2]), std::stoi(m[1]));
  }
  auto r = run_kiln({"generate", "-m", "10", "--verbose"});
  EXPECT_EQ(r.out.find("Speculative:"), std::string::npos) << r.out;  // no drafting, no line
}

TEST(SpecChat, DraftsLeaveGreedyAnswersUnchanged) {
  const std::string turns = "Once upon a time\nThe cat\n/exit\n";
  auto plain = run_kiln({"chat", "-m", "40"}, "", turns);
  auto spec = run_kiln({"chat", "-m", "40", "--draft-model", kDraft}, "", turns);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(spec.out, plain.out);
  auto v = run_kiln({"chat", "-m", "40", "--spec-ngram", "--verbose"}, "", turns);
  EXPECT_NE(v.out.find("[Speculative: "), std::string::npos) << v.out;
}

TEST(SpecErrors, MissingDraftModelIsNamed) {
  expect_one_line_error(run_kiln({"generate", "--draft-model", "/nonexistent/draft"}), {"--draft-model", "/nonexistent/draft"});
}

TEST(SpecErrors, DraftWithAnotherTokenizerIsRefusedNamingTheToken) {
  expect_one_line_error(run_kiln({"generate", "--draft-model", kShared + "/models/aidreams260K"}),
                        {"aidreams260K", "another tokenizer", "token id 259"});
}

TEST(SpecErrors, ServeRefusesABadDraftBeforeListening) {
  for (const std::string& draft : {kShared + "/models/aidreams260K", std::string("/nonexistent/draft")}) {
    auto r = run_kiln({"serve", "--port", "0", "--draft-model", draft});
    expect_one_line_error(r, {draft});
    EXPECT_EQ(r.err.find("http://"), std::string::npos) << r.err;
  }
}

TEST(SpecErrors, BadFlagsFailBeforeLoading) {
  // The model does not exist: the flag's error comes first, so nothing was loaded.
  auto r = run_kiln({"generate", "--model", "/nonexistent/model", "--num-draft-tokens", "17"});
  expect_one_line_error(r, {"--num-draft-tokens", "17"});
  EXPECT_EQ(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
  expect_one_line_error(run_kiln({"serve", "--num-draft-tokens", "-1"}), {"--num-draft-tokens"});
  expect_one_line_error(run_kiln({"generate", "--spec-ngram", "--draft-model", kDraft}), {"--draft-model", "--spec-ngram"});
  expect_one_line_error(run_kiln({"chat", "--spec-ngram-min", "3"}), {"--spec-ngram-min", "--spec-ngram"});
  expect_one_line_error(run_kiln({"generate", "--spec-accept", "maybe"}), {"--spec-accept", "maybe"});
  expect_one_line_error(run_kiln({"generate", "--spec-ngram", "--spec-ngram-min", "5", "--spec-ngram-max", "3"}),
                        {"--spec-ngram-min", "--spec-ngram-max"});
}
