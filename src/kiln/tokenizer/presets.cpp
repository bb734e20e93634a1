// Files that carry only a vocabulary: vocab.json + merges.txt (GPT-2, Qwen2 and friends) and tiktoken
// models (Llama 3). The pre-tokenizer, decoder and special tokens come from a family preset, written
// here as the tokenizer.json objects HF would have, so they run through the same code as tokenizer.json.
#include <algorithm>

#include "kiln/tokenizer/tokenizer_impl.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::tokenizer {

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

Json split_then_byte_level(const std::string& pattern) {
  return Json{{"type", "Sequence"},
              {"pretokenizers",
               Json::array({Json{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                            Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
}

Json special(const std::string& content, int32_t id) {
  return Json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
              {"rstrip", false}, {"normalized", false}, {"special", true}};
}

// The 256 special tokens of Llama 3.1 (ids first..first+255).
Json llama3_specials(int32_t first) {
  Json out = Json::array();
  const char* named[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                         "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                         "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"};
  for (int k = 0; k < 256; ++k) {
    std::string name = k < 11 ? named[k] : "<|reserved_special_token_" + std::to_string(k - 8) + "|>";
    out.push_back(special(name, first + k));
  }
  return out;
}

std::string config_class(const Json& config) {
  auto it = config.find("tokenizer_class");
  return it != config.end() && it->is_string() ? it->get<std::string>() : "";
}

Json parse_config(const std::string& text, const std::string& where) {
  if (text.empty()) return Json::object();
  Json c = parse_json(text, where, "tokenizer");
  if (!c.is_object()) return Json::object();
  return c;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    int v = base64_value(c);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return !out.empty();
}

}  // namespace

Pipeline preset_pipeline(Preset preset, const std::string& pattern, int32_t first_free_id, const Bpe& model,
                         const Json& config) {
  Pipeline p;
  Json& j = p.json;
  j["decoder"] = Json{{"type", "ByteLevel"}};
  Json added = Json::array();
  switch (preset) {
    case Preset::automatic:
    case Preset::gpt2: {
      bool prefix_space = config.contains("add_prefix_space") && config["add_prefix_space"].is_boolean() &&
                          config["add_prefix_space"].get<bool>();
      if (pattern.empty()) {
        j["pre_tokenizer"] = Json{{"type", "ByteLevel"}, {"add_prefix_space", prefix_space}, {"use_regex", true}};
      } else {
        j["pre_tokenizer"] = split_then_byte_level(pattern);
      }
      if (auto id = model.token_to_id("<|endoftext|>")) added.push_back(special("<|endoftext|>", *id));
      p.default_bos = p.default_eos = "<|endoftext|>";
      break;
    }
    case Preset::qwen2: {
      j["normalizer"] = Json{{"type", "NFC"}};
      j["pre_tokenizer"] = split_then_byte_level(pattern.empty() ? kQwen2Pattern : pattern);
      int32_t next = first_free_id;
      for (const char* name : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        auto id = model.token_to_id(name);
        added.push_back(special(name, id ? *id : next++));
      }
      p.default_eos = "<|endoftext|>";
      break;
    }
    case Preset::llama3: {
      j["pre_tokenizer"] = split_then_byte_level(pattern.empty() ? kLlama3Pattern : pattern);
      added = llama3_specials(first_free_id);
      j["post_processor"] = Json{{"type", "TemplateProcessing"},
                                 {"single", Json::array({Json{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                                         Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                                 {"special_tokens",
                                  {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {first_free_id}}}}}}};
      p.default_bos = "<|begin_of_text|>";
      p.default_eos = "<|end_of_text|>";
      break;
    }
  }
  j["added_tokens"] = std::move(added);
  return p;
}

std::unique_ptr<Tokenizer> vocab_merges_tokenizer(const std::string& vocab_json, const std::string& merges_txt,
                                                  const std::string& config_text, const std::string& where,
                                                  const std::string& config_where, Preset preset, const std::string& pattern) {
  Json vj = parse_json(vocab_json, where, "tokenizer");
  if (!vj.is_object()) fail("tokenizer", "{}: expected an object of token -> id", where);
  TokenMap vocab;
  vocab.reserve(vj.size());
  for (const auto& [tok, id] : vj.items()) {
    if (!id.is_number_integer()) fail("tokenizer", "{}: the id of \"{}\" is not an integer", where, tok.substr(0, 40));
    int64_t v = id.get<int64_t>();
    if (v < 0 || v >= kMaxTokenId) fail("tokenizer", "{}: token id {} is out of range", where, v);
    vocab.emplace(tok, static_cast<int32_t>(v));
  }
  Json config = parse_config(config_text, config_where);
  if (preset == Preset::automatic) {
    std::string cls = config_class(config);
    if (cls.find("Qwen") != std::string::npos) preset = Preset::qwen2;
    else if (cls.empty() && vocab.size() > 100000) preset = Preset::qwen2;
    else preset = Preset::gpt2;
  }
  BpeOptions opt;
  opt.ignore_merges = preset == Preset::llama3;  // tiktoken-style vocabularies emit whole-word tokens first
  auto bpe = std::make_unique<Bpe>(std::move(vocab), opt, where);

  // merges.txt: an optional "#version" line, then one "a b" pair per line in priority order.
  std::string merges_where = where.substr(0, where.rfind('/') + 1) + "merges.txt";
  std::vector<std::pair<std::string, std::string>> merges;
  size_t pos = 0, line_no = 0;
  while (pos < merges_txt.size()) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string::npos) end = merges_txt.size();
    std::string_view line(merges_txt.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
    size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 >= line.size()) {
      fail("tokenizer", "{}: line {} is not a merge \"a b\"", merges_where, line_no);
    }
    merges.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
  }
  bpe->set_merges(merges);
  Pipeline p = preset_pipeline(preset, pattern, bpe->max_id() + 1, *bpe, config);
  return assemble(std::move(bpe), p, config_text, where, config_where);
}

std::unique_ptr<Tokenizer> tiktoken_tokenizer(const std::string& model_text, const std::string& config_text,
                                              const std::string& where, const std::string& config_where, Preset preset,
                                              const std::string& pattern) {
  TokenMap vocab;
  std::vector<std::pair<int32_t, int32_t>> rank_id;  // (rank, id): in tiktoken files both are the rank
  std::string bytes;
  size_t pos = 0, line_no = 0;
  while (pos < model_text.size()) {
    size_t end = model_text.find('\n', pos);
    if (end == std::string::npos) end = model_text.size();
    std::string_view line(model_text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    size_t space = line.rfind(' ');
    bool ok = space != std::string_view::npos && space > 0 && space + 1 < line.size() && line.size() - space - 1 <= 8;
    int64_t rank = 0;
    for (size_t k = ok ? space + 1 : line.size(); k < line.size(); ++k) {
      ok = ok && line[k] >= '0' && line[k] <= '9';
      rank = rank * 10 + (line[k] - '0');
    }
    if (!ok || rank >= kMaxTokenId || !base64_decode(line.substr(0, space), bytes)) {
      fail("tokenizer", "{}: line {} is not \"<base64 token> <rank>\"", where, line_no);
    }
    // Tokens are raw bytes; store them in the GPT-2 byte alphabet so the byte-level pipeline applies.
    if (vocab.emplace(unicode::to_byte_level(bytes), static_cast<int32_t>(rank)).second) {
      rank_id.emplace_back(static_cast<int32_t>(rank), static_cast<int32_t>(rank));
    }
  }
  if (vocab.empty()) fail("tokenizer", "{}: no tokens", where);
  std::sort(rank_id.begin(), rank_id.end());
  std::vector<int32_t> ids_by_rank;
  ids_by_rank.reserve(rank_id.size());
  for (const auto& [rank, id] : rank_id) ids_by_rank.push_back(id);
  BpeOptions opt;
  opt.ignore_merges = true;  // tiktoken looks the whole piece up before merging
  auto bpe = std::make_unique<Bpe>(std::move(vocab), opt, where);
  bpe->set_merges_from_ranks(ids_by_rank);
  if (preset == Preset::automatic) preset = Preset::llama3;
  Json config = parse_config(config_text, config_where);
  Pipeline p = preset_pipeline(preset, pattern, bpe->max_id() + 1, *bpe, config);
  return assemble(std::move(bpe), p, config_text, where, config_where);
}

std::unique_ptr<Tokenizer> Tokenizer::from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt,
                                                        const std::string& tokenizer_config_json, const std::string& where,
                                                        Preset preset, const std::string& pattern) {
  return one_line_errors([&] {
    return vocab_merges_tokenizer(vocab_json, merges_txt, tokenizer_config_json, where,
                                  where + " (tokenizer_config.json)", preset, pattern);
  });
}

std::unique_ptr<Tokenizer> Tokenizer::from_tiktoken(const std::string& model_text, const std::string& tokenizer_config_json,
                                                    const std::string& where, Preset preset, const std::string& pattern) {
  return one_line_errors([&] {
    return tiktoken_tokenizer(model_text, tokenizer_config_json, where, where + " (tokenizer_config.json)", preset, pattern);
  });
}

}  // namespace kiln::tokenizer
