// Missing and malformed tokenizer files: each gives a one-line kiln::Error "[tokenizer] ..." that
// names the file at fault (and the problem), never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/base/error.h"
#include "kiln/base/mapped_file.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::tokenizer {
namespace {

namespace fs = std::filesystem;

class TokenizerErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_tok_err_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name, std::ios::binary) << text; }
  // The error of load_dir(dir_); fails the test when it loads.
  std::string load_error() {
    try {
      Tokenizer::load_dir(dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "loaded without an error";
    return "";
  }
  fs::path dir_;
};

void expect_one_line(const std::string& msg, const std::string& must_contain) {
  EXPECT_EQ(msg.rfind("[tokenizer] ", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find(must_contain), std::string::npos) << "\"" << msg << "\" lacks \"" << must_contain << "\"";
}

const char* kGoodJson = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}})";

TEST_F(TokenizerErrors, MissingFolderOrFiles) {
  std::string msg = load_error();
  expect_one_line(msg, dir_.string() + ": no tokenizer.json (or vocab.json+merges.txt");
  write("vocab.json", R"({"a": 0})");  // without merges.txt it is not a tokenizer
  expect_one_line(load_error(), "no tokenizer.json");
  try {
    Tokenizer::load_dir((dir_ / "does-not-exist").string());
    ADD_FAILURE();
  } catch (const Error& e) {
    expect_one_line(e.what(), "does-not-exist: no tokenizer.json");
  }
}

TEST_F(TokenizerErrors, MalformedTokenizerJson) {
  write("tokenizer.json", "{\"model\": {\"vocab\": {\"a\": 0,}}");
  std::string msg = load_error();
  expect_one_line(msg, (dir_ / "tokenizer.json").string() + ": invalid JSON");
  write("tokenizer.json", "[1, 2]");
  expect_one_line(load_error(), "tokenizer.json: expected a JSON object");
  write("tokenizer.json", R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})");
  expect_one_line(load_error(), "model type \"Unigram\" is not supported");
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": "zero"}}})");
  expect_one_line(load_error(), "tokenizer.json: vocab id must be an integer");
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 99999999}}})");
  expect_one_line(load_error(), "out of range");
  write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]}})");
  expect_one_line(load_error(), "a merge must be");
  write("tokenizer.json",
        R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"},
            "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  expect_one_line(load_error(), "regex /(unclosed/ does not compile");
  write("tokenizer.json", R"({"normalizer": {"type": "Fancy"}, "model": {"type": "BPE", "vocab": {"a": 0}}})");
  expect_one_line(load_error(), "unsupported normalizer type \"Fancy\"");
  // A template id that no token has would index past the embedding table.
  write("tokenizer.json", R"({"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
                              {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [7]}}},
                              "model": {"type": "BPE", "vocab": {"a": 0}}})");
  expect_one_line(load_error(), "post_processor id 7 is not a token");
  write("tokenizer.json", R"({"decoder": {"type": "ByteLevel"}, "added_tokens": [{"content": "x"}],
                              "model": {"type": "BPE", "vocab": {"a": 0}}})");
  expect_one_line(load_error(), "added token id must be an integer");
}

TEST_F(TokenizerErrors, MalformedConfigNamesTheConfigFile) {
  write("tokenizer.json", kGoodJson);
  write("tokenizer_config.json", "{\"bos_token\": ");
  expect_one_line(load_error(), (dir_ / "tokenizer_config.json").string() + ": invalid JSON");
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"seven": {"content": "<x>"}}})");
  expect_one_line(load_error(), "tokenizer_config.json: added_tokens_decoder key \"seven\"");
  write("tokenizer_config.json", R"({"bos_token": "a", "add_bos_token": true})");
  auto tok = Tokenizer::load_dir(dir_.string());
  EXPECT_EQ(tok->encode("b"), (std::vector<int32_t>{0, 1}));
}

TEST_F(TokenizerErrors, MalformedVocabMergesAndTiktoken) {
  write("vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  write("merges.txt", "#version: 0.2\na b\nnospace\n");
  expect_one_line(load_error(), (dir_ / "merges.txt").string() + ": line 3 is not a merge");
  write("merges.txt", "#version: 0.2\na b\n");
  EXPECT_EQ(Tokenizer::load_dir(dir_.string())->encode("ab"), std::vector<int32_t>{2});
  fs::remove(dir_ / "vocab.json");
  fs::remove(dir_ / "merges.txt");
  write("tokenizer.model", "YQ== 0\nYg== 1\nYWI= 2\n");  // "a", "b", "ab"
  auto tik = Tokenizer::load_dir(dir_.string());
  EXPECT_EQ(tik->encode("ab", false), std::vector<int32_t>{2});
  EXPECT_EQ(tik->encode("ba", false), (std::vector<int32_t>{1, 0}));
  write("tokenizer.model", "YQ== 0\nYg== one\n");  // tiktoken by its first line, broken on the second
  expect_one_line(load_error(), (dir_ / "tokenizer.model").string() + ": line 2 is not");
  try {
    Tokenizer::from_tiktoken("YQ== 0\n!!!! 1\n", "", "t.model");
    ADD_FAILURE();
  } catch (const Error& e) {
    expect_one_line(e.what(), "t.model: line 2 is not \"<base64 token> <rank>\"");
  }
  write("tokenizer.model", std::string("\x0a\x05\x0a\x03", 4));  // protobuf cut short
  expect_one_line(load_error(), "tokenizer.model: not a SentencePiece model");
}

TEST_F(TokenizerErrors, FromJsonNamesItsSource) {
  try {
    Tokenizer::from_json("not json", "", "embedded model");
    ADD_FAILURE();
  } catch (const Error& e) {
    expect_one_line(e.what(), "embedded model: invalid JSON");
  }
  try {
    Tokenizer::from_json(kGoodJson, "{", "embedded model");
    ADD_FAILURE();
  } catch (const Error& e) {
    expect_one_line(e.what(), "embedded model (tokenizer_config.json): invalid JSON");
  }
}

}  // namespace
}  // namespace kiln::tokenizer
