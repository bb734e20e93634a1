// The one renderer and override policy: the fallback's two forms, default kwargs under a call's,
// add_generation_prompt, and which template TemplatePolicy::load picks from the flags and folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/base/error.h"
#include "kiln/chat/prompt.h"

namespace kiln::chat {
namespace {

namespace fs = std::filesystem;

const OrderedJson kMessages = OrderedJson::parse(R"([{"role": "system", "content": "a"}, {"role": "user", "content": "b"}])");

TEST(Renderer, FallbackJoinsContents) {
  Renderer r;
  EXPECT_EQ(r.chat_template(), nullptr);
  Prompt joined = r.render(kMessages, OrderedJson::parse(R"({"add_generation_prompt": "ignored"})"));
  EXPECT_EQ(joined.text, "a\nb");
  EXPECT_TRUE(joined.add_special_tokens);
  EXPECT_EQ(r.render(kMessages, OrderedJson::object(), Fallback::line_per_message).text, "a\nb\n");
}

TEST(Renderer, KwargsOverDefaultsAndAddGenerationPrompt) {
  Renderer r(ChatTemplate::from_string("{{ messages|length }}{{ x }}{{ y }}{{ add_generation_prompt }}"),
             OrderedJson::parse(R"({"x": 1, "y": 2})"));
  Prompt p = r.render(kMessages);
  EXPECT_EQ(p.text, "212True");
  EXPECT_FALSE(p.add_special_tokens);  // the template writes its own
  EXPECT_EQ(r.render(kMessages, OrderedJson::parse(R"({"y": 3, "add_generation_prompt": false})")).text, "213False");
  EXPECT_THROW(r.render(kMessages, OrderedJson::parse(R"({"add_generation_prompt": 1})")), Error);
}

struct PolicyTest : ::testing::Test {
  fs::path dir = fs::temp_directory_path() / ("kiln_prompt_test_" + std::to_string(::getpid()));
  void SetUp() override {
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>", "pad_token": "<pad>", "chat_template": "F{{ eos_token }}"})";
    std::ofstream(dir / "other.jinja") << "O{{ pad_token }}{{ k }}";
  }
  void TearDown() override { fs::remove_all(dir); }
};

TEST_F(PolicyTest, PicksTheTemplate) {
  TemplatePolicy p;
  EXPECT_EQ(p.load(dir.string(), nullptr).render(kMessages).text, "F</s>");  // the folder's
  p.chat_template = (dir / "other.jinja").string();
  p.kwargs = R"({"k": 7})";
  EXPECT_EQ(p.load(dir.string(), nullptr).render(kMessages).text, "O<pad>7");  // the file, the folder's tokens
  EXPECT_EQ(p.load("", nullptr).render(kMessages).text, "O7");  // no folder: no pad_token
  p.ignore_chat_template = true;
  EXPECT_EQ(p.load(dir.string(), nullptr).chat_template(), nullptr);
  TemplatePolicy text;
  text.chat_template = "T{{ k }}";
  text.template_is_text = true;
  text.kwargs = R"({"k": 1})";
  EXPECT_EQ(text.load(dir.string(), nullptr).render(kMessages).text, "T1");
  EXPECT_EQ(TemplatePolicy().load("", nullptr).chat_template(), nullptr);
}

TEST_F(PolicyTest, StartAndBadFlags) {
  TemplatePolicy p;
  p.system_prompt = "be kind";
  EXPECT_EQ(p.start().dump(), R"([{"role":"system","content":"be kind"}])");
  EXPECT_TRUE(TemplatePolicy().start().empty());
  p.kwargs = "[1]";
  EXPECT_THROW(p.load(dir.string(), nullptr), Error);
  p.kwargs = "{";
  EXPECT_THROW(p.load(dir.string(), nullptr), Error);
  TemplatePolicy missing;
  missing.chat_template = (dir / "missing.jinja").string();
  EXPECT_THROW(missing.load(dir.string(), nullptr), Error);
}

}  // namespace
}  // namespace kiln::chat
