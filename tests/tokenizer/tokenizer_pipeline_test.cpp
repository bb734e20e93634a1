// The tokenizer.json building blocks one by one, on small inputs whose HF `tokenizers` results are
// known (the examples of the HF documentation, or worked out by hand from its rules): split
// behaviours, pre-tokenizers, normalizers, decoders, BPE options, added-token matching and
// post-processors.
#include <gtest/gtest.h>

#include "kiln/tokenizer/decoder.h"
#include "kiln/tokenizer/normalizer.h"
#include "kiln/tokenizer/pre_tokenizer.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::tokenizer {
namespace {

std::vector<std::string> pre_tokenize(const Json& j, const std::string& text) {
  auto pre = make_pre_tokenizer(j, "test");
  std::vector<Piece> pieces{{text, true}};
  pre->split(pieces);
  std::vector<std::string> out;
  for (const auto& p : pieces) out.push_back(p.text);
  return out;
}

using Strings = std::vector<std::string>;

TEST(PreTokenizer, SplitBehaviours) {
  // The HF documentation's example: "the-final--countdown" split on "-".
  auto split = [](const char* behavior) {
    return pre_tokenize({{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}},
                        "the-final--countdown");
  };
  EXPECT_EQ(split("Removed"), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated"), (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"), (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous"), (Strings{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizer, SplitRegexAndInvert) {
  Json isolated = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_EQ(pre_tokenize(isolated, "ab12cd345"), (Strings{"ab", "12", "cd", "345"}));
  // invert: the pattern matches what to keep; with Removed everything else goes.
  Json keep = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Removed"}, {"invert", true}};
  EXPECT_EQ(pre_tokenize(keep, "héllo, wörld!"), (Strings{"héllo", "wörld"}));
}

TEST(PreTokenizer, WhitespaceFamily) {
  EXPECT_EQ(pre_tokenize({{"type", "Whitespace"}}, "Hey friend!     How are you?!?"),
            (Strings{"Hey", "friend", "!", "How", "are", "you", "?!?"}));
  EXPECT_EQ(pre_tokenize({{"type", "WhitespaceSplit"}}, "Hey friend!  How\tare"), (Strings{"Hey", "friend!", "How", "are"}));
  EXPECT_EQ(pre_tokenize({{"type", "Punctuation"}}, "Hey, friend!"), (Strings{"Hey", ",", " friend", "!"}));
  EXPECT_EQ(pre_tokenize({{"type", "BertPreTokenizer"}}, "Hey, friend!"), (Strings{"Hey", ",", "friend", "!"}));
  EXPECT_EQ(pre_tokenize({{"type", "CharDelimiterSplit"}, {"delimiter", "|"}}, "a|b||c"), (Strings{"a", "b", "c"}));
}

TEST(PreTokenizer, Digits) {
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "Call 123 please"),
            (Strings{"Call ", "1", "2", "3", " please"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "Call 123 please"),
            (Strings{"Call ", "123", " please"}));
}

TEST(PreTokenizer, Metaspace) {
  const std::string m = "\xE2\x96\x81";
  EXPECT_EQ(pre_tokenize({{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}, {"split", true}},
                         "Hey friend!"),
            (Strings{m + "Hey", m + "friend!"}));
  EXPECT_EQ(pre_tokenize({{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "never"}, {"split", false}},
                         "Hey friend"),
            (Strings{"Hey" + m + "friend"}));
  // "first" prepends only to text at the start of the input; an existing leading space is enough.
  Json first = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "first"}, {"split", false}};
  EXPECT_EQ(pre_tokenize(first, "Hey"), (Strings{m + "Hey"}));
  EXPECT_EQ(pre_tokenize(first, " Hey"), (Strings{m + "Hey"}));
  auto pre = make_pre_tokenizer(first, "test");
  std::vector<Piece> later{{"Hey", false}};
  pre->split(later);
  EXPECT_EQ(later[0].text, "Hey");
}

TEST(PreTokenizer, ByteLevel) {
  // The HF documentation's example for ByteLevel(add_prefix_space=True).
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}},
                         "Hello my friend, how is your day going?"),
            (Strings{"\xC4\xA0Hello", "\xC4\xA0my", "\xC4\xA0" "friend", ",", "\xC4\xA0how", "\xC4\xA0is", "\xC4\xA0your",
                     "\xC4\xA0" "day", "\xC4\xA0going", "?"}));
  // No regex: the whole piece, bytes mapped (newline -> Ċ, é -> Ã©).
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}, "a b\n\xC3\xA9"),
            (Strings{"a\xC4\xA0" "b\xC4\x8A\xC3\x83\xC2\xA9"}));
}

TEST(PreTokenizer, Sequence) {
  Json seq = {{"type", "Sequence"},
              {"pretokenizers", Json::array({Json{{"type", "WhitespaceSplit"}},
                                             Json{{"type", "Digits"}, {"individual_digits", true}}})}};
  EXPECT_EQ(pre_tokenize(seq, "Hey 123"), (Strings{"Hey", "1", "2", "3"}));
}

std::string normalize(const Json& j, std::string s) {
  make_normalizer(j, "test")->normalize(s);
  return s;
}

TEST(Normalizer, UnicodeForms) {
  EXPECT_EQ(normalize({{"type", "NFC"}}, "e\xCC\x81"), "\xC3\xA9");                // e + ◌́ -> é
  EXPECT_EQ(normalize({{"type", "NFD"}}, "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(normalize({{"type", "NFKC"}}, "\xEF\xAC\x81 \xE2\x91\xA0"), "fi 1");  // ﬁ ① -> fi 1
  EXPECT_EQ(normalize({{"type", "NFKD"}}, "\xC3\xA9"), "e\xCC\x81");
}

TEST(Normalizer, CaseStripReplacePrepend) {
  EXPECT_EQ(normalize({{"type", "Lowercase"}}, "HeLLo \xC3\x89T\xC3\x89"), "hello \xC3\xA9t\xC3\xA9");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, " \t hi  "), "hi  ");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, "\xE3\x80\x80hi\n"), "hi");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}}, "a b  c"), "a_b__c");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}, "a b   c"), "a b c");
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "_"}}, "x"), "_x");
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "_"}}, ""), "");
  Json accents = {{"type", "Sequence"}, {"normalizers", Json::array({Json{{"type", "NFD"}}, Json{{"type", "StripAccents"}}})}};
  EXPECT_EQ(normalize(accents, "caf\xC3\xA9 na\xC3\xAFve"), "cafe naive");
}

Strings decode_chain(const Json& j, Strings tokens) {
  make_decoder(j, "test")->decode_chain(tokens);
  return tokens;
}

TEST(Decoder, ByteFallbackGroups) {
  Json bf = {{"type", "ByteFallback"}};
  EXPECT_EQ(decode_chain(bf, {"<0xE6>", "<0x97>", "<0xA5>", "x"}), (Strings{"\xE6\x97\xA5", "x"}));
  // An invalid group gives one U+FFFD per byte; unrelated tokens are kept.
  EXPECT_EQ(decode_chain(bf, {"a", "<0xE6>", "<0x97>", "b"}), (Strings{"a", "\xEF\xBF\xBD", "\xEF\xBF\xBD", "b"}));
  EXPECT_EQ(decode_chain(bf, {"<0xZZ>", "<0x41"}), (Strings{"<0xZZ>", "<0x41"}));
}

TEST(Decoder, LlamaChainAndMetaspace) {
  const std::string m = "\xE2\x96\x81";
  Json llama = {{"type", "Sequence"},
                {"decoders", Json::array({Json{{"type", "Replace"}, {"pattern", {{"String", m}}}, {"content", " "}},
                                          Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}},
                                          Json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  EXPECT_EQ(decode_chain(llama, {m + "Hello", m + "world", "<0x21>"}), (Strings{"Hello world!"}));
  EXPECT_EQ(decode_chain(llama, {m + m + "two"}), (Strings{" two"}));  // Strip removes one space only
  Json meta = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}};
  EXPECT_EQ(decode_chain(meta, {m + "Hey", m + "friend"}), (Strings{"Hey", " friend"}));
}

TEST(Decoder, ByteLevelWordPieceBpeSuffix) {
  EXPECT_EQ(decode_chain({{"type", "ByteLevel"}}, {"\xC4\xA0" "caf", "\xC3\x83\xC2\xA9"}), (Strings{" caf\xC3\xA9"}));
  // A token outside the byte alphabet (an added token with a space) keeps its own bytes.
  EXPECT_EQ(decode_chain({{"type", "ByteLevel"}}, {"a", "<x y>"}), (Strings{"a<x y>"}));
  EXPECT_EQ(decode_chain({{"type", "WordPiece"}, {"prefix", "##"}}, {"un", "##aff", "##able", "day"}),
            (Strings{"un", "aff", "able", " day"}));
  EXPECT_EQ(decode_chain({{"type", "BPEDecoder"}, {"suffix", "</w>"}}, {"hel", "lo</w>", "you</w>"}),
            (Strings{"hel", "lo ", "you"}));
}

// A small character-level BPE tokenizer.json for end-to-end checks.
Json tiny_tokenizer() {
  Json vocab = Json::object();
  int id = 0;
  for (const char* t : {"<unk>", "<s>", "</s>", "a", "b", "c", " ", "ab", "abc", "<", ">", "m", "x", "<0xC3>", "<0xA9>"}) {
    vocab[t] = id++;
  }
  return {{"version", "1.0"},
          {"added_tokens", Json::array({Json{{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                                        Json{{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Fuse"}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges", Json::array({"a b", "ab c"})},
            {"unk_token", "<unk>"},
            {"fuse_unk", false},
            {"byte_fallback", false}}}};
}

std::vector<int32_t> ids_of(const Json& j, const std::string& text, const std::string& config = "") {
  return Tokenizer::from_json(j.dump(), config, "tiny")->encode(text, false);
}

TEST(Bpe, MergesUnkAndByteFallback) {
  Json j = tiny_tokenizer();
  EXPECT_EQ(ids_of(j, "abc"), (std::vector<int32_t>{8}));
  EXPECT_EQ(ids_of(j, "abab c"), (std::vector<int32_t>{7, 7, 6, 5}));
  EXPECT_EQ(ids_of(j, "azzb"), (std::vector<int32_t>{3, 0, 0, 4}));  // unknown characters: one unk each
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(ids_of(j, "azzb"), (std::vector<int32_t>{3, 0, 4}));
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(ids_of(j, "a\xC3\xA9z"), (std::vector<int32_t>{3, 13, 14, 0}));  // é has byte tokens, z not
  // Merges as [a, b] pairs mean the same.
  j["model"]["merges"] = Json::array({Json::array({"a", "b"}), Json::array({"ab", "c"})});
  EXPECT_EQ(ids_of(j, "abc"), (std::vector<int32_t>{8}));
  // Merge priority is the list order: with "b c" first, "abc" becomes a + bc... not in vocab, so a, b, c
  // stay apart once "b c" has no token; add one and it wins over "a b".
  j["model"]["vocab"]["bc"] = 15;
  j["model"]["merges"] = Json::array({"b c", "a b", "ab c"});
  EXPECT_EQ(ids_of(j, "abc"), (std::vector<int32_t>{3, 15}));
}

TEST(Bpe, IgnoreMerges) {
  Json j = tiny_tokenizer();
  j["model"]["vocab"]["ac"] = 15;  // a token no merge produces
  EXPECT_EQ(ids_of(j, "ac"), (std::vector<int32_t>{3, 5}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(ids_of(j, "ac"), (std::vector<int32_t>{15}));
}

TEST(AddedTokens, MatchedBeforeTheModelWithStripOptions) {
  Json j = tiny_tokenizer();
  j["added_tokens"].push_back({{"id", 20}, {"content", "<m>"}, {"special", false}, {"normalized", false}});
  EXPECT_EQ(ids_of(j, "a <m> b"), (std::vector<int32_t>{3, 6, 20, 6, 4}));
  j["added_tokens"][2]["lstrip"] = true;
  EXPECT_EQ(ids_of(j, "a <m> b"), (std::vector<int32_t>{3, 20, 6, 4}));
  j["added_tokens"][2]["rstrip"] = true;
  EXPECT_EQ(ids_of(j, "a  <m>  b"), (std::vector<int32_t>{3, 20, 4}));
  // single_word: not inside a word.
  j["added_tokens"][2] = {{"id", 20}, {"content", "<m>"}, {"single_word", true}, {"normalized", false}};
  EXPECT_EQ(ids_of(j, "a <m> b"), (std::vector<int32_t>{3, 6, 20, 6, 4}));
  EXPECT_EQ(ids_of(j, "a<m> b"), (std::vector<int32_t>{3, 9, 11, 10, 6, 4}));
  auto tok = Tokenizer::from_json(j.dump(), "", "tiny");
  EXPECT_EQ(tok->vocab_size(), 21);
  EXPECT_EQ(tok->id_to_token(20), "<m>");
  EXPECT_EQ(tok->token_to_id("<m>"), std::optional<int32_t>(20));
  EXPECT_FALSE(tok->is_special(20));
}

TEST(AddedTokens, LeftmostLongestAndNormalizedMatching) {
  Json j = tiny_tokenizer();
  j["model"]["vocab"]["<ab>"] = 15;
  j["added_tokens"].push_back({{"id", 9}, {"content", "<"}, {"special", false}, {"normalized", false}});
  j["added_tokens"].push_back({{"id", 15}, {"content", "<ab>"}, {"special", false}, {"normalized", false}});
  EXPECT_EQ(ids_of(j, "<ab>c<a"), (std::vector<int32_t>{15, 5, 9, 3}));
  // normalized=true tokens are matched in the normalized text (here lowercased, so "X" matches "x"
  // and "X"); normalized=false tokens only in the raw text.
  Json k = tiny_tokenizer();
  k["normalizer"] = {{"type", "Lowercase"}};
  k["added_tokens"].push_back({{"id", 21}, {"content", "X"}, {"special", false}, {"normalized", true}});
  k["added_tokens"].push_back({{"id", 22}, {"content", "M"}, {"special", false}, {"normalized", false}});
  EXPECT_EQ(ids_of(k, "aXbM"), (std::vector<int32_t>{3, 21, 4, 22}));
  EXPECT_EQ(ids_of(k, "axbm"), (std::vector<int32_t>{3, 21, 4, 11}));
}

TEST(AddedTokens, SkipSpecialOnDecode) {
  auto tok = Tokenizer::from_json(tiny_tokenizer().dump(), "", "tiny");
  std::vector<int32_t> ids = {1, 8, 2};
  EXPECT_EQ(tok->decode(ids, true), "abc");
  EXPECT_EQ(tok->decode(ids, false), "<s>abc</s>");
  EXPECT_EQ(tok->encode("<s>abc</s>", false), ids);
}

TEST(PostProcessor, TemplateRobertaAndConfigFlags) {
  Json j = tiny_tokenizer();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", Json::array({Json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                                 Json{{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}, {"</s>", {{"id", "</s>"}, {"ids", {2}}}}}}};
  auto tok = Tokenizer::from_json(j.dump(), "", "tiny");
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{1, 7, 2}));
  EXPECT_EQ(tok->encode("ab", false), (std::vector<int32_t>{7}));
  // tokenizer_config.json's add_bos_token / add_eos_token win over the template.
  auto no_eos = Tokenizer::from_json(j.dump(), R"({"bos_token": "<s>", "eos_token": "</s>", "add_eos_token": false})", "tiny");
  EXPECT_EQ(no_eos->encode("ab"), (std::vector<int32_t>{1, 7}));
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}, {"cls", {"<s>", 1}}};
  EXPECT_EQ(Tokenizer::from_json(j.dump(), "", "tiny")->encode("c"), (std::vector<int32_t>{1, 5, 2}));
  j["post_processor"] = {{"type", "ByteLevel"}};
  auto bos = Tokenizer::from_json(j.dump(), R"({"bos_token": {"content": "<s>"}, "add_bos_token": true})", "tiny");
  EXPECT_EQ(bos->encode("c"), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(bos->bos_id(), std::optional<int32_t>(1));
  EXPECT_FALSE(bos->eos_id().has_value());
}

TEST(PostProcessor, DeepseekConfigAddsBos) {
  // deepseek-coder's post_processor is ByteLevel; its tokenizer_config.json sets add_bos_token.
  auto tok = Tokenizer::load_dir(std::string(KILN_SHARED_DIR) + "/fixtures/tokenizers/deepseek-coder");
  auto ids = tok->encode("def f():");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 32013);
  EXPECT_EQ(tok->eos_id(), std::optional<int32_t>(32021));
  EXPECT_EQ(tok->decode(ids), "def f():");
  EXPECT_EQ(tok->decode(ids, false), "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>def f():");
}

}  // namespace
}  // namespace kiln::tokenizer
