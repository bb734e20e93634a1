// Loading: tokenizer.json (+ tokenizer_config.json), vocab.json + merges.txt, tiktoken tokenizer.model,
// and a model folder holding one of them. Every loader ends in assemble(), which reads the pipeline
// (normalizer, pre-tokenizer, decoder, post-processor, added tokens) and the BOS/EOS configuration.
#include <algorithm>
#include <filesystem>

#include "kiln/base/mapped_file.h"
#include "kiln/tokenizer/json_reader.h"
#include "kiln/tokenizer/tokenizer_impl.h"

namespace kiln::tokenizer {

namespace fs = std::filesystem;

namespace {

int32_t checked_id(const Json& v, const std::string& where, const char* what) {
  if (!v.is_number_integer()) fail("tokenizer", "{}: {} must be an integer id, not {}", where, what, v.type_name());
  int64_t id = v.get<int64_t>();
  if (id < 0 || id >= kMaxTokenId) fail("tokenizer", "{}: {} {} is out of range (0..{})", where, what, id, kMaxTokenId - 1);
  return static_cast<int32_t>(id);
}

AddedToken parse_added_token(const Json& j, const std::string& where, std::optional<int32_t> id_from_key) {
  if (!j.is_object()) fail("tokenizer", "{}: an added token must be an object", where);
  AddedToken t;
  if (id_from_key) {
    t.id = *id_from_key;
  } else {
    static const Json missing;
    auto it = j.find("id");
    t.id = checked_id(it == j.end() ? missing : *it, where, "added token id");
  }
  t.content = json_str(j, "content", where, "");
  t.special = json_bool(j, "special", where, false);
  t.single_word = json_bool(j, "single_word", where, false);
  t.lstrip = json_bool(j, "lstrip", where, false);
  t.rstrip = json_bool(j, "rstrip", where, false);
  t.normalized = json_bool(j, "normalized", where, !t.special);
  return t;
}

// bos_token & co. in tokenizer_config.json: a string, {"content": ...}, or null.
std::string config_token(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

// The ids one post-processor puts before and after a single sequence.
void parse_post_processor(const Json& j, const std::string& where, std::vector<int32_t>& prefix,
                          std::vector<int32_t>& suffix, int depth) {
  if (j.is_null()) return;
  if (depth > kMaxNesting) fail("tokenizer", "{}: post_processors nested deeper than {}", where, kMaxNesting);
  const std::string& type = json_type(j, where + " post_processor");
  std::string at = where + " post_processor " + type;
  if (type == "ByteLevel") return;  // offsets only
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto token_id = [&](const char* key) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2) fail("tokenizer", "{}: \"{}\" must be [token, id]", at, key);
      return checked_id((*it)[1], at, key);
    };
    prefix.insert(prefix.begin(), token_id("cls"));
    suffix.push_back(token_id("sep"));
    return;
  }
  if (type == "TemplateProcessing") {
    auto single = j.find("single");
    if (single == j.end() || !single->is_array()) fail("tokenizer", "{}: \"single\" must be a list", at);
    static const Json no_specials = Json::object();
    auto sit = j.find("special_tokens");
    const Json& specials = sit == j.end() ? no_specials : *sit;
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (const auto& item : *single) {
      std::string name;
      if (item.is_object() && item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].is_object()) {
        name = json_str(item["SpecialToken"], "id", at, "");
      } else if (item.is_string()) {  // the "$A" / "<s>:0" string form
        name = item.get<std::string>();
        if (!name.empty() && name[0] == '$') {
          seen_sequence = true;
          continue;
        }
        name = name.substr(0, name.rfind(':'));
      } else {
        fail("tokenizer", "{}: unrecognised template item (a {})", at, item.type_name());
      }
      auto sp = specials.is_object() ? specials.find(name) : specials.end();
      if (sp == specials.end() || !sp->is_object() || !sp->contains("ids") || !(*sp)["ids"].is_array()) {
        fail("tokenizer", "{}: special token \"{}\" of the template has no \"ids\" in \"special_tokens\"", at, name);
      }
      for (const auto& id : (*sp)["ids"]) (seen_sequence ? after : before).push_back(checked_id(id, at, "template id"));
    }
    prefix.insert(prefix.begin(), before.begin(), before.end());
    suffix.insert(suffix.end(), after.begin(), after.end());
    return;
  }
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) fail("tokenizer", "{}: \"processors\" must be a list", at);
    for (const auto& p : *it) parse_post_processor(p, where, prefix, suffix, depth + 1);
    return;
  }
  fail("tokenizer", "{}: unsupported post_processor type \"{}\" (kiln reads TemplateProcessing, ByteLevel, "
       "RobertaProcessing, BertProcessing, Sequence)", where, type);
}

// add_bos_token / add_eos_token in tokenizer_config.json decide, as transformers' Llama-style
// tokenizers do, whether BOS/EOS go around the text, whatever the post-processor template says.
void apply_add_flags(Tokenizer::Impl& m) {
  // ids: the prefix (BOS goes first) or the suffix (EOS goes last).
  auto apply = [&](const char* key, std::optional<int32_t> id, std::vector<int32_t>& ids, bool first) {
    auto it = m.config.find(key);
    if (it == m.config.end() || !it->is_boolean() || !id) return;
    bool add = it->get<bool>(), has = std::find(ids.begin(), ids.end(), *id) != ids.end();
    if (add && !has) ids.insert(first ? ids.begin() : ids.end(), *id);
    if (!add) ids.erase(std::remove(ids.begin(), ids.end(), *id), ids.end());
  };
  apply("add_bos_token", m.bos_id, m.prefix_ids, true);
  apply("add_eos_token", m.eos_id, m.suffix_ids, false);
}

std::string read_if_exists(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return "";
  return read_file(p.string(), "tokenizer");
}

// tiktoken files are text lines "<base64> <rank>"; SentencePiece models are binary protobuf.
bool looks_like_tiktoken(const std::string& text) {
  size_t end = text.find('\n');
  std::string_view line = std::string_view(text).substr(0, end == std::string::npos ? std::min<size_t>(text.size(), 256) : end);
  size_t space = line.rfind(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 >= line.size()) return false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    bool ok = i < space ? (std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/' || c == '=')
                        : i == space || (c >= '0' && c <= '9') || c == '\r';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<Tokenizer> assemble(std::unique_ptr<Bpe> model, const Pipeline& pipeline, const std::string& config_text,
                                    const std::string& where, const std::string& config_where) {
  auto m = std::make_unique<Tokenizer::Impl>();
  m->where = where;
  const Json& pj = pipeline.json;
  auto get = [&](const char* key) -> const Json& {
    static const Json null_json;
    auto it = pj.find(key);
    return it == pj.end() ? null_json : *it;
  };
  m->normalizer = make_normalizer(get("normalizer"), where);
  m->pre_tokenizer = make_pre_tokenizer(get("pre_tokenizer"), where);
  m->decoder = make_decoder(get("decoder"), where);
  if (const Json& added = get("added_tokens"); !added.is_null()) {
    if (!added.is_array()) fail("tokenizer", "{}: \"added_tokens\" must be a list", where);
    for (const auto& t : added) m->added.add(parse_added_token(t, where + " added_tokens", std::nullopt));
  }

  if (!config_text.empty()) {
    m->config = parse_json(config_text, config_where, "tokenizer");
    if (!m->config.is_object()) fail("tokenizer", "{}: expected a JSON object", config_where);
  }
  const Json& config = m->config;
  if (auto it = config.find("added_tokens_decoder"); it != config.end() && it->is_object()) {
    for (const auto& [key, tok] : it->items()) {
      int64_t id = -1;
      try {
        id = std::stoll(key);
      } catch (const std::exception&) {
        fail("tokenizer", "{}: added_tokens_decoder key \"{}\" is not an id", config_where, key);
      }
      m->added.add(parse_added_token(tok, config_where + " added_tokens_decoder", checked_id(Json(id), config_where, "id")));
    }
  }
  // Special tokens the config names and the model has: transformers registers them as special added tokens.
  std::vector<std::string> named;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) named.push_back(config_token(config, key));
  if (auto it = config.find("additional_special_tokens"); it != config.end() && it->is_array()) {
    for (const auto& t : *it) {
      if (t.is_string()) named.push_back(t.get<std::string>());
      else if (t.is_object() && t.contains("content") && t["content"].is_string()) named.push_back(t["content"].get<std::string>());
    }
  }
  for (const auto& name : named) {
    if (name.empty() || m->added.by_content(name)) continue;
    if (auto id = model->token_to_id(name)) m->added.add(AddedToken{name, *id, false, false, false, false, true});
  }
  m->added.build(m->normalizer.get());
  m->model = std::move(model);

  parse_post_processor(get("post_processor"), where, m->prefix_ids, m->suffix_ids, 0);
  // Ids the post-processor adds go straight to the model's embedding table: they must be tokens.
  for (const auto* list : {&m->prefix_ids, &m->suffix_ids}) {
    for (int32_t id : *list) {
      if (!m->added.by_id(id) && !m->model->id_to_token(id)) {
        fail("tokenizer", "{}: post_processor id {} is not a token of the vocabulary", where, id);
      }
    }
  }

  bool has_config = !config_text.empty();
  m->bos_token = has_config ? config_token(config, "bos_token") : pipeline.default_bos;
  m->eos_token = has_config ? config_token(config, "eos_token") : pipeline.default_eos;
  auto lookup = [&](const std::string& tok) -> std::optional<int32_t> {
    if (tok.empty()) return std::nullopt;
    if (auto id = m->added.by_content(tok)) return id;
    return m->model->token_to_id(tok);
  };
  m->bos_id = lookup(m->bos_token);
  m->eos_id = lookup(m->eos_token);
  apply_add_flags(*m);
  m->vocab_size = std::max(m->model->max_id(), m->added.max_id()) + 1;
  return std::make_unique<Tokenizer>(std::move(m));
}

namespace {

bool mentions_byte_level(const Json& j, int depth = 0) {
  if (depth > kMaxNesting) return false;
  if (j.is_object()) {
    auto t = j.find("type");
    if (t != j.end() && t->is_string() && t->get<std::string>() == "ByteLevel") return true;
  }
  if (!j.is_object() && !j.is_array()) return false;
  for (const auto& v : j) {  // an object's values, an array's items
    if (mentions_byte_level(v, depth + 1)) return true;
  }
  return false;
}

// transformers 5 builds LlamaTokenizer's pipeline in code and takes only the vocabulary and merges
// from tokenizer.json: no normalizer, Metaspace(▁, split=false) with the prepend scheme that
// add_prefix_space (default true) and legacy (default false) select, and the Replace/ByteFallback/
// Fuse(/Strip) decoder. kiln does the same so that it matches transformers on such folders (the
// stories260K reference was made this way), except for byte-level vocabularies that name the class
// (DeepSeek), where that pipeline would be wrong and the file's own pipeline is kept.
void apply_llama_class_pipeline(Pipeline& p, const std::string& config_text, const std::string& config_where) {
  if (config_text.empty()) return;
  Json config = parse_json(config_text, config_where, "tokenizer");
  if (!config.is_object()) return;
  std::string cls = json_str(config, "tokenizer_class", config_where, "");
  if (cls != "LlamaTokenizer" && cls != "LlamaTokenizerFast") return;
  for (const char* key : {"normalizer", "pre_tokenizer", "decoder"}) {
    if (p.json.contains(key) && mentions_byte_level(p.json[key])) return;
  }
  bool add_prefix_space = json_bool(config, "add_prefix_space", config_where, true);
  bool legacy = json_bool(config, "legacy", config_where, false);
  const std::string meta = "\xE2\x96\x81";  // ▁
  p.json["normalizer"] = nullptr;
  p.json["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", meta},
                             {"prepend_scheme", add_prefix_space ? (legacy ? "always" : "first") : "never"},
                             {"split", false}};
  Json decoders = Json::array({Json{{"type", "Replace"}, {"pattern", {{"String", meta}}}, {"content", " "}},
                               Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}}});
  if (add_prefix_space) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  p.json["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& tokenizer_json, const std::string& config_text,
                                               const std::string& where, const std::string& config_where) {
  TokenizerJsonParts parts = read_tokenizer_json(tokenizer_json, where);
  Json& j = parts.doc;
  if (!j.is_object()) fail("tokenizer", "{}: expected a JSON object at the top level", where);
  auto mit = j.find("model");
  if (mit == j.end() || !mit->is_object()) fail("tokenizer", "{}: missing the \"model\" object", where);
  const Json& mj = *mit;
  std::string type = json_str(mj, "type", where + " model", "BPE");
  if (type != "BPE") {
    fail("tokenizer", "{}: model type \"{}\" is not supported (kiln reads BPE tokenizers)", where, type);
  }
  if (!parts.has_vocab) fail("tokenizer", "{}: model \"vocab\" must be an object", where);
  if (mj.contains("merges") && !mj["merges"].is_null()) fail("tokenizer", "{}: model \"merges\" must be a list", where);

  BpeOptions opt;
  std::string at = where + " model";
  if (auto u = mj.find("unk_token"); u != mj.end() && u->is_string()) opt.unk_token = u->get<std::string>();
  opt.byte_fallback = json_bool(mj, "byte_fallback", at, false);
  opt.fuse_unk = json_bool(mj, "fuse_unk", at, false);
  opt.ignore_merges = json_bool(mj, "ignore_merges", at, false);
  opt.continuing_subword_prefix = json_str(mj, "continuing_subword_prefix", at, "");
  opt.end_of_word_suffix = json_str(mj, "end_of_word_suffix", at, "");
  auto bpe = std::make_unique<Bpe>(std::move(parts.vocab), opt, where);

  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(parts.merges.size());
  for (auto& mg : parts.merges) {
    if (mg.is_pair) {
      merges.emplace_back(std::move(mg.a), std::move(mg.b));
      continue;
    }
    const std::string& s = mg.a;
    // "a b": tokens may themselves hold spaces, so pick the split whose halves are both tokens.
    size_t split = s.find(' ');
    for (size_t p = split; p != std::string::npos; p = s.find(' ', p + 1)) {
      if (bpe->token_to_id(std::string_view(s).substr(0, p)) && bpe->token_to_id(std::string_view(s).substr(p + 1))) {
        split = p;
        break;
      }
    }
    if (split == std::string::npos) fail("tokenizer", "{}: merge \"{}\" is not \"a b\"", where, s.substr(0, 80));
    merges.emplace_back(s.substr(0, split), s.substr(split + 1));
  }
  parts.merges.clear();
  bpe->set_merges(merges);

  Pipeline p;
  for (const char* key : {"normalizer", "pre_tokenizer", "decoder", "post_processor", "added_tokens"}) {
    if (auto it = j.find(key); it != j.end()) p.json[key] = std::move(*it);
  }
  apply_llama_class_pipeline(p, config_text, config_where);
  return assemble(std::move(bpe), p, config_text, where, config_where);
}
}  // namespace

std::string printable_message(const std::string& what, const std::string& component) {
  std::string msg = what.substr(std::min(what.size(), component.size() + 3));  // drop "[component] "
  std::string out;
  for (char c : msg) {
    auto u = static_cast<unsigned char>(c);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20 || u == 0x7F) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  constexpr size_t kMax = 600;
  if (out.size() > kMax) {
    size_t cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
    out = out.substr(0, cut) + "...";
  }
  return out;
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json, const std::string& tokenizer_config_json,
                                                const std::string& where) {
  return one_line_errors(
      [&] { return load_tokenizer_json(tokenizer_json, tokenizer_config_json, where, where + " (tokenizer_config.json)"); });
}

std::unique_ptr<Tokenizer> Tokenizer::load_dir(const std::string& dir) {
  return one_line_errors([&] { return load_dir_impl(dir); });
}

std::unique_ptr<Tokenizer> load_dir_impl(const std::string& dir) {
  fs::path d(dir);
  std::string config = read_if_exists(d / "tokenizer_config.json");
  std::string config_where = (d / "tokenizer_config.json").string();
  std::error_code ec;
  if (fs::is_regular_file(d / "tokenizer.json", ec)) {
    std::string where = (d / "tokenizer.json").string();
    return load_tokenizer_json(read_file(where, "tokenizer"), config, where, config_where);
  }
  if (fs::is_regular_file(d / "vocab.json", ec) && fs::is_regular_file(d / "merges.txt", ec)) {
    return vocab_merges_tokenizer(read_file((d / "vocab.json").string(), "tokenizer"),
                                  read_file((d / "merges.txt").string(), "tokenizer"), config, (d / "vocab.json").string(),
                                  config_where, Preset::automatic, "");
  }
  if (fs::is_regular_file(d / "tokenizer.model", ec)) {
    std::string where = (d / "tokenizer.model").string();
    std::string text = read_file(where, "tokenizer");
    if (looks_like_tiktoken(text)) return tiktoken_tokenizer(text, config, where, config_where, Preset::llama3, "");
    return sentencepiece_tokenizer(text, config, where, config_where);
  }
  fail("tokenizer", "{}: no tokenizer.json (or vocab.json+merges.txt, or tokenizer.model) found; "
       "point at a Hugging Face model folder", dir);
}

}  // namespace kiln::tokenizer
