// `kiln generate` end to end through the binary: the embedded default from an empty folder,
// a model folder, stdin prompts, seeds, and one-line errors for bad models.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_util.h"
#include "kiln/base/json.h"

using kiln::test::run_kiln;
namespace fs = std::filesystem;

static const std::string kShared = KILN_SHARED_DIR;

TEST(Generate, EmbeddedDefaultFromEmptyDirPrintsTheStory) {
  std::string dir = kiln::test::make_temp_dir("kiln-gen-");
  auto r = run_kiln({"generate", "--max-tokens", "60", "--temp", "0"}, dir);
  fs::remove_all(dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ref = kiln::read_json_file(kShared + "/models/stories260K/reference.json");
  EXPECT_EQ(r.out, ref["bos_greedy_text"].get<std::string>() + "\n");
  EXPECT_EQ(r.out.rfind("Once upon a time, there was a little girl named Lily. She loved to play outside in the park.", 0), 0u);
}

TEST(Generate, ModelFolderAndPromptMatchReference) {
  auto ref = kiln::read_json_file(kShared + "/models/stories260K/reference.json");
  auto r = run_kiln({"generate", "--model", kShared + "/models/stories260K", "--prompt", ref["prompt"].get<std::string>(),
                     "--max-tokens", "100", "--temp", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // greedy_text is the decode of prompt + 100 tokens; generate prints only the continuation.
  std::string full = ref["greedy_text"].get<std::string>(), prompt = ref["prompt"].get<std::string>();
  EXPECT_EQ(prompt + r.out, full + "\n");
}

TEST(Generate, PromptFromStdin) {
  auto a = run_kiln({"generate", "--prompt", "-", "--max-tokens", "20"}, "", "Lily and Tim");
  auto b = run_kiln({"generate", "--prompt", "Lily and Tim", "--max-tokens", "20"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_FALSE(a.out.empty());
}

TEST(Generate, SameSeedSameText) {
  std::vector<std::string> args = {"generate", "--temp", "1.0", "--top-p", "0.9", "--max-tokens", "40", "--seed", "7"};
  auto a = run_kiln(args), b = run_kiln(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  args.back() = "8";
  auto c = run_kiln(args);
  EXPECT_NE(a.out, c.out);
}

TEST(Generate, VerboseReportsSpeedAndMemory) {
  auto r = run_kiln({"generate", "--max-tokens", "10", "--verbose"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Prompt: 1 tokens, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Generation: 10 tokens, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Peak memory: "), std::string::npos) << r.out;
}

namespace {
// Copies a model folder into a temp dir so a test can break one file.
std::string copy_model(const std::string& name) {
  std::string dir = kiln::test::make_temp_dir("kiln-bad-");
  fs::copy(kShared + "/models/" + name, dir, fs::copy_options::recursive);
  for (auto& e : fs::directory_iterator(dir)) fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return dir;
}
void expect_one_line_error(const kiln::test::RunResult& r, const std::string& must_contain) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "crashed: " << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}
}  // namespace

TEST(GenerateErrors, NonexistentModelPath) {
  auto r = run_kiln({"generate", "--model", "/nonexistent/model"});
  expect_one_line_error(r, "/nonexistent/model");
}

TEST(GenerateErrors, TruncatedSafetensors) {
  std::string dir = copy_model("stories260K");
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") / 2);
  expect_one_line_error(run_kiln({"generate", "--model", dir}), "model.safetensors");
  fs::remove_all(dir);
}

TEST(GenerateErrors, SafetensorsHeaderPastTheEnd) {
  std::string dir = copy_model("tiny-llama");
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t huge = 1ull << 40;  // the 8-byte little-endian header length
  f.write(reinterpret_cast<const char*>(&huge), 8);
  f.close();
  expect_one_line_error(run_kiln({"generate", "--model", dir}), "model.safetensors");
  fs::remove_all(dir);
}

TEST(GenerateErrors, MalformedSafetensorsHeaderJson) {
  std::string dir = copy_model("tiny-llama");
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("{{{{{{", 6);  // the header's first bytes: no longer valid JSON
  f.close();
  auto r = run_kiln({"generate", "--model", dir});
  expect_one_line_error(r, "model.safetensors");
  EXPECT_NE(r.err.find("JSON"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(GenerateErrors, MissingConfigKey) {
  std::string dir = copy_model("tiny-llama");
  auto cfg = kiln::read_json_file(dir + "/config.json");
  cfg.erase("num_hidden_layers");
  std::ofstream(dir + "/config.json") << cfg.dump();
  expect_one_line_error(run_kiln({"generate", "--model", dir}), "num_hidden_layers");
  fs::remove_all(dir);
}

TEST(GenerateErrors, UnknownModelType) {
  std::string dir = copy_model("tiny-llama");
  auto cfg = kiln::read_json_file(dir + "/config.json");
  cfg["model_type"] = "transformer9000";
  std::ofstream(dir + "/config.json") << cfg.dump();
  expect_one_line_error(run_kiln({"generate", "--model", dir}), "transformer9000");
  fs::remove_all(dir);
}

TEST(GenerateErrors, MissingTokenizer) {
  std::string dir = copy_model("tiny-llama");
  fs::remove(dir + "/tokenizer.json");
  expect_one_line_error(run_kiln({"generate", "--model", dir}), "tokenizer");
  fs::remove_all(dir);
}

TEST(GenerateErrors, MalformedConfigJson) {
  std::string dir = copy_model("tiny-llama");
  std::ofstream(dir + "/config.json") << "{\"model_type\": ";
  expect_one_line_error(run_kiln({"generate", "--model", dir}), "config.json");
  fs::remove_all(dir);
}

// --max-kv-size (the rotating KV cache): a 400-token generation past a 64-token window runs; a
// window as long as the whole run prints what the plain cache does; bad values are refused by name;
// a prompt cache file is only continued with the --max-kv-size it was made with.
TEST(Generate, MaxKvSizeRotatesAndRefusesBadValues) {
  auto r = run_kiln({"generate", "--max-kv-size", "64", "--max-tokens", "400", "--temp", "0", "--verbose"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  auto plain = run_kiln({"generate", "--max-tokens", "300", "--temp", "0"});
  auto roomy = run_kiln({"generate", "--max-kv-size", "400", "--max-tokens", "300", "--temp", "0"});
  ASSERT_EQ(roomy.exit_code, 0) << roomy.err;
  EXPECT_EQ(roomy.out, plain.out);
  for (const char* bad : {"3", "4", "-2", "x"}) {
    auto b = run_kiln({"generate", "--max-kv-size", bad, "--max-tokens", "5"});
    EXPECT_NE(b.exit_code, 0) << bad;
    EXPECT_NE(b.err.find(std::string(bad) + " is not a whole number more than 4"), std::string::npos) << b.err;
  }

  std::string dir = kiln::test::make_temp_dir("kiln-rot-");
  const std::string file = dir + "/p.safetensors";
  const std::string story = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
  auto made = run_kiln({"cache-prompt", "--max-kv-size", "16", "--prompt", story, "--prompt-cache-file", file});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  auto other = run_kiln({"generate", "--prompt-cache-file", file, "--prompt", " She", "--max-tokens", "5"});
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.err.find("made with --max-kv-size 16 and this run has no --max-kv-size"), std::string::npos)
      << other.err;
  auto same = run_kiln({"generate", "--max-kv-size", "16", "--prompt-cache-file", file, "--prompt", " She",
                        "--max-tokens", "5"});
  EXPECT_EQ(same.exit_code, 0) << same.err;
  fs::remove_all(dir);
}

// Structured output: --json-schema (the output parses and has the required keys and types),
// --grammar (GBNF) and --regex; a bad schema is a one-line error.
TEST(Generate, JsonSchemaGrammarAndRegexConstrainTheOutput) {
  std::string dir = kiln::test::make_temp_dir("kiln-gen-structured-");
  {
    std::ofstream(dir + "/s.json") << R"({"type":"object","properties":{"name":{"type":"string","maxLength":10},
      "n":{"type":"integer","minimum":0,"maximum":99}},"required":["name","n"]})";
    std::ofstream(dir + "/g.gbnf") << "root ::= \"(\" [0-9] [0-9]? \")\"\n";
    std::ofstream(dir + "/bad.json") << R"({"type":"foo"})";
  }
  for (const char* seed : {"1", "2", "3"}) {
    auto r = run_kiln({"generate", "--json-schema", dir + "/s.json", "--temp", "1", "--seed", seed, "-m", "200"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_FALSE(r.out.empty());
    kiln::Json j = kiln::Json::parse(r.out.substr(0, r.out.size() - 1));
    EXPECT_TRUE(j["name"].is_string()) << r.out;
    EXPECT_LE(j["name"].get<std::string>().size(), 40u) << r.out;  // 10 code points
    EXPECT_TRUE(j["n"].is_number_integer()) << r.out;
  }
  auto g = run_kiln({"generate", "--grammar", dir + "/g.gbnf", "--temp", "1", "--seed", "4"});
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_TRUE(g.out.size() >= 4 && g.out.size() <= 5 && g.out[0] == '(' && g.out[g.out.size() - 2] == ')') << g.out;
  auto x = run_kiln({"generate", "--regex", "(red|green)-[0-9]{2}", "--temp", "1"});
  ASSERT_EQ(x.exit_code, 0) << x.err;
  EXPECT_TRUE(x.out == "red-" + x.out.substr(4, 2) + "\n" || x.out.rfind("green-", 0) == 0) << x.out;
  auto bad = run_kiln({"generate", "--json-schema", dir + "/bad.json"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("unknown type"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}
