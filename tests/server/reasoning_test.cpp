// ReasoningSplitter against the one-piece split: every way of cutting a sample into pieces gives
// the same (reasoning, content), so a tag split across tokens never leaks; the prompt-opened
// block, output without tags, and tags inside the answer.
#include <gtest/gtest.h>

#include "kiln/server/reasoning.h"

using namespace kiln::server;

namespace {

struct Split {
  std::string reasoning, content;
  bool operator==(const Split&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Split& s) {
  return os << "{reasoning: \"" << s.reasoning << "\", content: \"" << s.content << "\"}";
}

Split run(bool open, const std::vector<std::string>& pieces) {
  ReasoningSplitter sp(open);
  Split out;
  for (const std::string& p : pieces) {
    auto piece = sp.push(p);
    out.reasoning += piece.reasoning;
    out.content += piece.content;
  }
  auto rest = sp.flush();
  out.reasoning += rest.reasoning;
  out.content += rest.content;
  return out;
}

// All cuts of text into two and three pieces, and one byte per piece, give `want`.
void expect_every_split(bool open, const std::string& text, const Split& want) {
  EXPECT_EQ(run(open, {text}), want) << text;
  for (size_t i = 0; i <= text.size(); ++i) {
    EXPECT_EQ(run(open, {text.substr(0, i), text.substr(i)}), want) << text << " cut at " << i;
    for (size_t j = i; j <= text.size(); ++j)
      ASSERT_EQ(run(open, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}), want)
          << text << " cut at " << i << ", " << j;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(run(open, bytes), want) << text << " byte by byte";
}

}  // namespace

TEST(Reasoning, TheModelOpensTheBlock) {
  // Qwen3 with thinking on: "<think>\n...\n</think>\n\n" then the answer.
  expect_every_split(false, "<think>\nLet me add: 2+2 is 4.\n</think>\n\nThe answer is 4.",
                     {"Let me add: 2+2 is 4.", "The answer is 4."});
  expect_every_split(false, "\n<think>a < b</think>ok", {"a < b", "ok"});
  // A closing tag inside the answer is the answer's text; so is a second block.
  expect_every_split(false, "<think>r</think>x </think> <think>y</think>", {"r", "x </think> <think>y</think>"});
}

TEST(Reasoning, ThePromptOpenedTheBlock) {
  // QwQ / DeepSeek-R1: the prompt ends with "<think>\n"; only the closing tag comes.
  expect_every_split(true, "Hmm, 4.\n</think>\n\n4", {"Hmm, 4.", "4"});
  // A block that never closes (max_tokens) is all reasoning.
  expect_every_split(true, "still thinking <th", {"still thinking <th", ""});
  expect_every_split(true, "</think>4", {"", "4"});
  expect_every_split(true, "\n  Hmm.</think>4", {"Hmm.", "4"});
}

TEST(Reasoning, OutputWithoutTagsIsContent) {
  // Qwen3 with enable_thinking false (the prompt closed an empty block): the answer as it is.
  expect_every_split(false, "Just 4. <think>not a block</think>", {"", "Just 4. <think>not a block</think>"});
  expect_every_split(false, "  <thin", {"", "  <thin"});
  expect_every_split(false, "<thinking>", {"", "<thinking>"});
  expect_every_split(false, "", {"", ""});
}

TEST(Reasoning, PartialTagsAreHeldBack) {
  ReasoningSplitter sp(false);
  auto p = sp.push("<thi");
  EXPECT_EQ(p.content, "");
  EXPECT_EQ(p.reasoning, "");
  p = sp.push("nk>abc</th");
  EXPECT_EQ(p.reasoning, "abc");
  EXPECT_EQ(p.content, "");
  p = sp.push("ink>\n\nhello");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "hello");
}

TEST(Reasoning, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<think>old</think>answer<|im_start|>assistant\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<think>old</think>answer<|Assistant|><think>\n"));
}
