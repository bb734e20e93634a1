// The stories260K tokenizer (the embedded default model): the transformers `encode` table of
// reference.json (ids include BOS), decoding of the reference greedy continuations, BOS/EOS from
// tokenizer_config.json, special tokens in the text, and skip_special_tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "kiln/base/json.h"
#include "kiln/base/mapped_file.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::tokenizer {
namespace {

const std::string kDir = std::string(KILN_SHARED_DIR) + "/models/stories260K";

const Tokenizer& stories() {
  static auto tok = Tokenizer::load_dir(kDir);
  return *tok;
}

const Json& reference() {
  static Json ref = read_json_file(kDir + "/reference.json");
  return ref;
}

TEST(Stories, EncodeTableMatchesTransformers) {
  const Json& table = reference().at("encode");
  ASSERT_GE(table.size(), 5u);
  for (const auto& [text, ids] : table.items()) {
    EXPECT_EQ(stories().encode(text), ids.get<std::vector<int32_t>>()) << "\"" << text << "\"";
  }
}

TEST(Stories, PromptIdsMatchReference) {
  EXPECT_EQ(stories().encode(reference().at("prompt").get<std::string>()),
            reference().at("prompt_ids").get<std::vector<int32_t>>());
  EXPECT_EQ(stories().encode("Once upon a time"), (std::vector<int32_t>{1, 403, 407, 261, 378}));
}

TEST(Stories, DecodesGreedyContinuationsLikeTransformers) {
  for (const char* key : {"greedy", "bos_greedy"}) {
    auto ids = reference().at(std::string(key) + "_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(stories().decode(ids, true), reference().at(std::string(key) + "_text").get<std::string>()) << key;
  }
}

TEST(Stories, BosEosFromConfig) {
  const Tokenizer& tok = stories();
  EXPECT_EQ(tok.bos_id(), std::optional<int32_t>(1));
  EXPECT_EQ(tok.eos_id(), std::optional<int32_t>(2));
  EXPECT_EQ(tok.bos_token(), "<s>");
  EXPECT_EQ(tok.eos_token(), "</s>");
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.config().value("model_max_length", 0), 512);
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_TRUE(tok.is_special(2));
  EXPECT_FALSE(tok.is_special(403));
  EXPECT_EQ(tok.token_to_id("<s>"), std::optional<int32_t>(1));
  EXPECT_EQ(tok.id_to_token(403), tok.id_to_token(*tok.token_to_id(tok.id_to_token(403))));
  EXPECT_FALSE(tok.token_to_id("no such token").has_value());
}

TEST(Stories, AddSpecialTokensFalseHasNoBos) {
  auto with = stories().encode("Once upon a time");
  auto without = stories().encode("Once upon a time", false);
  ASSERT_EQ(with.size(), without.size() + 1);
  EXPECT_EQ(with.front(), 1);
  EXPECT_TRUE(std::equal(without.begin(), without.end(), with.begin() + 1));
  EXPECT_EQ(stories().encode("", false), std::vector<int32_t>{});
  EXPECT_EQ(stories().encode(""), std::vector<int32_t>{1});
}

TEST(Stories, SpecialTokensInTextAreNeverSplit) {
  const Tokenizer& tok = stories();
  auto ids = tok.encode("Hello</s><s>world</s>", false);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1);
  // The text around them is encoded as it would be alone (Metaspace prepends ▁ only at the start).
  auto hello = tok.encode("Hello", false);
  EXPECT_TRUE(std::equal(hello.begin(), hello.end(), ids.begin()));
  // A near miss is plain text.
  auto near = tok.encode("</s >", false);
  EXPECT_EQ(std::count(near.begin(), near.end(), 2), 0);
}

TEST(Stories, SkipSpecialTokens) {
  const Tokenizer& tok = stories();
  auto ids = tok.encode("The end.</s>");
  EXPECT_EQ(tok.decode(ids, true), "The end.");
  EXPECT_EQ(tok.decode(ids, false), "<s> The end.</s>");
}

TEST(Stories, RoundTripsTextWithByteFallback) {
  const Tokenizer& tok = stories();
  for (const auto& [text, ids] : reference().at("encode").items()) {
    if (text.find("</s>") != std::string::npos) continue;
    // Metaspace "first" adds no ▁ before a leading space and decoding strips one: HF drops that space.
    EXPECT_EQ(tok.decode(tok.encode(text)), text[0] == ' ' ? text.substr(1) : text);
  }
  std::string mixed = "Tim said: \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x9A\x80 \xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82!\n\ttabs";
  EXPECT_EQ(tok.decode(tok.encode(mixed)), mixed);
}

TEST(Stories, InvalidUtf8InputIsRepaired) {
  const Tokenizer& tok = stories();
  // A stray continuation byte and a truncated sequence become U+FFFD, as Python's decode(errors="replace") would.
  auto ids = tok.encode("a\x80" "b\xE6\x97", false);
  EXPECT_EQ(tok.decode(ids), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

TEST(Stories, FromJsonMatchesLoadDir) {
  auto tok = Tokenizer::from_json(read_file(kDir + "/tokenizer.json"), read_file(kDir + "/tokenizer_config.json"),
                                  "embedded stories260K");
  EXPECT_EQ(tok->encode("Lily and Tim went to the park."), stories().encode("Lily and Tim went to the park."));
  EXPECT_EQ(tok->bos_id(), std::optional<int32_t>(1));
  // Without tokenizer_config.json there is no configured BOS, but the template still adds <s>.
  auto bare = Tokenizer::from_json(read_file(kDir + "/tokenizer.json"), "", "bare");
  EXPECT_FALSE(bare->bos_id().has_value());
  EXPECT_EQ(bare->encode("Once upon a time"), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_TRUE(bare->config().is_object());
  EXPECT_TRUE(bare->config().empty());
}

TEST(Stories, ConcurrentEncodesAgree) {
  const Tokenizer& tok = stories();
  std::string text = reference().at("greedy_text").get<std::string>();
  auto expected = tok.encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 20; ++r) got[t] = tok.encode(text + std::to_string(r % 3));
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], tok.encode(text + std::to_string(19 % 3)));
  EXPECT_EQ(tok.encode(text), expected);
}

}  // namespace
}  // namespace kiln::tokenizer
