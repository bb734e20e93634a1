// Every tokenizer under shared/fixtures/tokenizers against its llama.cpp reference encodings (46
// strings each, ids from HF tokenizers without special tokens), through each file format kiln reads:
// tokenizer.json, vocab.json + merges.txt, tiktoken and SentencePiece tokenizer.model. Also checks
// decode round trips and that the streaming detokenizer prints exactly what decode() prints.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "kiln/base/mapped_file.h"
#include "kiln/base/utf8.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::tokenizer {
namespace {

const std::string kTok = std::string(KILN_SHARED_DIR) + "/fixtures/tokenizers/";

struct Variant {
  std::string name;
  std::string vectors;  // <dir>/<stem> of the .inp/.out pair
  std::function<std::unique_ptr<Tokenizer>()> load;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"gpt2_vocab_merges", "gpt2/ggml-vocab-gpt-2.gguf", [] { return Tokenizer::load_dir(kTok + "gpt2"); }},
      {"llama2_tokenizer_json", "llama2/ggml-vocab-llama-spm.gguf", [] { return Tokenizer::load_dir(kTok + "llama2"); }},
      {"llama2_sentencepiece_model", "llama2/ggml-vocab-llama-spm.gguf",
       [] {
         return Tokenizer::from_sentencepiece(read_file(kTok + "llama2/tokenizer.model"),
                                              read_file(kTok + "llama2/tokenizer_config.json"), kTok + "llama2/tokenizer.model");
       }},
      {"deepseek_coder_tokenizer_json", "deepseek-coder/ggml-vocab-deepseek-coder.gguf",
       [] { return Tokenizer::load_dir(kTok + "deepseek-coder"); }},
      {"qwen2_tokenizer_json", "qwen2/ggml-vocab-qwen2.gguf", [] { return Tokenizer::load_dir(kTok + "qwen2"); }},
      {"qwen2_vocab_merges", "qwen2/ggml-vocab-qwen2.gguf",
       [] {
         return Tokenizer::from_vocab_merges(read_file(kTok + "qwen2/vocab.json"), read_file(kTok + "qwen2/merges.txt"), "",
                                             kTok + "qwen2/vocab.json", Preset::automatic);
       }},
      {"llama3_tokenizer_json", "llama3/ggml-vocab-llama-bpe.gguf", [] { return Tokenizer::load_dir(kTok + "llama3"); }},
      {"llama3_tiktoken", "llama3/ggml-vocab-llama-bpe.gguf",
       [] { return Tokenizer::from_tiktoken(read_file(kTok + "llama3/tokenizer.model"), "", kTok + "llama3/tokenizer.model"); }},
  };
  return v;
}

// Each tokenizer is loaded once per test program.
const Tokenizer& get(const Variant& v) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[v.name];
  if (!slot) slot = v.load();
  return *slot;
}

struct Vectors {
  std::vector<std::string> inputs;
  std::vector<std::vector<int32_t>> ids;
};

Vectors read_vectors(const std::string& stem) {
  Vectors out;
  std::string inp = read_file(kTok + stem + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0; pos < inp.size();) {
    size_t end = inp.find(sep, pos);
    if (end == std::string::npos) break;
    out.inputs.push_back(inp.substr(pos, end - pos));
    pos = end + sep.size();
  }
  std::string text = read_file(kTok + stem + ".out");
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::vector<int32_t> ids;
    std::string line = text.substr(pos, end - pos);
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && line[i] == ' ') ++i;
      size_t j = i;
      while (j < line.size() && line[j] != ' ') ++j;
      if (j > i) ids.push_back(static_cast<int32_t>(std::stol(line.substr(i, j - i))));
      i = j;
    }
    out.ids.push_back(std::move(ids));
    pos = end + 1;
  }
  return out;
}

class Fixture : public ::testing::TestWithParam<size_t> {
 protected:
  const Variant& variant() const { return variants()[GetParam()]; }
};

// The llama2 tokenizer.json was re-saved by transformers 5: Metaspace(prepend_scheme "first"), which
// (in HF tokenizers and transformers alike) adds no ▁ when the text already starts with a space once
// spaces are ▁. The llama.cpp vectors come from SentencePiece semantics (the original tokenizer), which
// always adds the dummy prefix: " Hello" -> "▁▁Hello". So for a string that starts with a space the
// HF answer is SentencePiece's answer for the string without that space; every other string must
// match the vectors as they are. (The SentencePiece tokenizer.model variant matches all 46 as they are.)
std::vector<int32_t> expected_ids(const Variant& v, const std::string& text, const std::vector<int32_t>& reference) {
  if (v.name != "llama2_tokenizer_json" || text.empty() || text[0] != ' ') return reference;
  const Tokenizer& spm = get(variants()[2]);
  if (text.size() == 1) return {*spm.token_to_id("\xE2\x96\x81")};
  return spm.encode(text.substr(1), false);
}

TEST_P(Fixture, MatchesReferenceEncodings) {
  const Variant& v = variant();
  Vectors vec = read_vectors(v.vectors);
  ASSERT_EQ(vec.inputs.size(), 46u);
  ASSERT_EQ(vec.ids.size(), 46u);
  const Tokenizer& tok = get(v);
  int matched = 0;
  for (size_t k = 0; k < vec.inputs.size(); ++k) {
    auto ids = tok.encode(vec.inputs[k], /*add_special_tokens=*/false);
    if (ids == expected_ids(v, vec.inputs[k], vec.ids[k])) {
      ++matched;
    } else {
      ADD_FAILURE() << v.name << " string " << k << " \"" << vec.inputs[k] << "\"\n  got      " << fmt::format("{}", ids)
                    << "\n  expected " << fmt::format("{}", expected_ids(v, vec.inputs[k], vec.ids[k]));
    }
  }
  EXPECT_EQ(matched, 46) << v.name;
}

TEST_P(Fixture, DecodeRoundTrips) {
  const Variant& v = variant();
  const Tokenizer& tok = get(v);
  for (const auto& s : read_vectors(v.vectors).inputs) {
    auto ids = tok.encode(s, false);
    // Metaspace "first" (see expected_ids) puts no extra ▁ before a leading space, and decoding strips
    // one leading space, so HF loses that space too.
    bool loses_space = v.name == "llama2_tokenizer_json" && !s.empty() && s[0] == ' ';
    EXPECT_EQ(tok.decode(ids), loses_space ? s.substr(1) : s) << v.name << ": \"" << s << "\"";
  }
}

TEST_P(Fixture, StreamingEqualsFullDecode) {
  const Variant& v = variant();
  const Tokenizer& tok = get(v);
  auto inputs = read_vectors(v.vectors).inputs;
  std::string all;  // every string at once too: a long stream with emoji, CJK and byte tokens
  for (const auto& s : inputs) all += s;
  inputs.push_back(all);
  for (bool add_special : {false, true}) {
    for (const auto& s : inputs) {
      auto ids = tok.encode(s, add_special);
      for (bool skip : {true, false}) {
        StreamDecoder stream(tok, skip);
        std::string printed;
        for (int32_t id : ids) {
          std::string piece = stream.push(id);
          EXPECT_TRUE(utf8::valid(piece)) << v.name << ": a push printed broken UTF-8 for \"" << s << "\"";
          printed += piece;
        }
        printed += stream.flush();
        EXPECT_EQ(printed, tok.decode(ids, skip)) << v.name << " skip=" << skip << ": \"" << s << "\"";
      }
    }
  }
}

TEST_P(Fixture, VocabularyAccessorsAgree) {
  const Tokenizer& tok = get(variant());
  EXPECT_GT(tok.vocab_size(), 1000);
  for (int32_t id : {0, 100, 1000, tok.vocab_size() - 1}) {
    std::string t = tok.id_to_token(id);
    if (t.empty()) continue;
    auto back = tok.token_to_id(t);
    ASSERT_TRUE(back.has_value()) << id << " " << t;
    EXPECT_EQ(tok.id_to_token(*back), t);
  }
  EXPECT_EQ(tok.id_to_token(-1), "");
  EXPECT_EQ(tok.id_to_token(tok.vocab_size()), "");
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Fixture, ::testing::Range<size_t>(0, variants().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return variants()[info.param].name; });

// The tiktoken loader's special tokens are the Llama 3.1 ones that the converted tokenizer.json lists.
TEST(TokenizerFormats, TiktokenSpecialsMatchTokenizerJson) {
  const auto& vs = variants();
  const Tokenizer& json = get(vs[6]);
  const Tokenizer& tik = get(vs[7]);
  ASSERT_EQ(json.vocab_size(), 128256);
  ASSERT_EQ(tik.vocab_size(), 128256);
  for (int32_t id = 128000; id < 128256; ++id) {
    EXPECT_EQ(tik.id_to_token(id), json.id_to_token(id)) << id;
    EXPECT_EQ(tik.is_special(id), json.is_special(id)) << id;
  }
  for (int32_t id : {0, 1, 500, 5000, 127999}) EXPECT_EQ(tik.id_to_token(id), json.id_to_token(id)) << id;
  auto ids = tik.encode("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", false);
  EXPECT_EQ(ids, json.encode("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", false));
  EXPECT_EQ(ids.front(), 128006);
  EXPECT_EQ(ids.back(), 128009);
}

// Both Qwen2 formats give the same tokenizer.
TEST(TokenizerFormats, QwenVocabMergesMatchesTokenizerJson) {
  const auto& vs = variants();
  const Tokenizer& json = get(vs[4]);
  const Tokenizer& pair = get(vs[5]);
  EXPECT_EQ(json.vocab_size(), pair.vocab_size());
  std::string text = "<|im_start|>user\nCafe\xCC\x81 na\xC3\xAFve 12345 \xE6\x97\xA5\xE6\x9C\xAC<|im_end|>";
  EXPECT_EQ(json.encode(text, false), pair.encode(text, false));
  EXPECT_EQ(pair.encode("<|im_end|>", false), std::vector<int32_t>{151645});
}

TEST(TokenizerFormats, SentencePieceModelMatchesTokenizerJson) {
  const auto& vs = variants();
  const Tokenizer& json = get(vs[1]);
  const Tokenizer& spm = get(vs[2]);
  EXPECT_EQ(json.vocab_size(), spm.vocab_size());
  EXPECT_EQ(spm.bos_id(), std::optional<int32_t>(1));
  EXPECT_EQ(spm.eos_id(), std::optional<int32_t>(2));
  std::string text = "Hello world</s> and <s>again \xF0\x9F\x98\x80";
  EXPECT_EQ(json.encode(text), spm.encode(text));
  EXPECT_EQ(spm.encode(text).front(), 1);
}

}  // namespace
}  // namespace kiln::tokenizer
