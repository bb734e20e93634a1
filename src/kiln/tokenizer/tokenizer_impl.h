// Internal: the parts of a Tokenizer, and the builder that the loaders (tokenizer.json, vocab.json +
// merges.txt, tiktoken) share. Not part of the public API.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/tokenizer/added_vocab.h"
#include "kiln/tokenizer/bpe.h"
#include "kiln/tokenizer/decoder.h"
#include "kiln/tokenizer/normalizer.h"
#include "kiln/tokenizer/pre_tokenizer.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::tokenizer {

struct Tokenizer::Impl {
  std::string where;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> model;
  std::unique_ptr<Decoder> decoder;
  AddedVocab added;
  std::vector<int32_t> prefix_ids, suffix_ids;  // post-processor output around one sequence
  Json config = Json::object();
  std::string bos_token, eos_token;
  std::optional<int32_t> bos_id, eos_id;
  int32_t vocab_size = 0;
};

// Everything but the model, in tokenizer.json form: "normalizer", "pre_tokenizer", "decoder",
// "post_processor", "added_tokens" (presets build this object for files that lack it).
struct Pipeline {
  Json json = Json::object();
  std::string default_bos, default_eos;  // used when there is no tokenizer_config.json
};

// Builds a Tokenizer from a model and the pipeline object; reads tokenizer_config.json (may be "")
// for BOS/EOS, add_bos_token/add_eos_token and added_tokens_decoder. Defined in loader.cpp.
std::unique_ptr<Tokenizer> assemble(std::unique_ptr<Bpe> model, const Pipeline& pipeline, const std::string& config_text,
                                    const std::string& where, const std::string& config_where);

// The other file formats (presets.cpp, sentencepiece_model.cpp); config_where names the config file.
std::unique_ptr<Tokenizer> vocab_merges_tokenizer(const std::string& vocab_json, const std::string& merges_txt,
                                                  const std::string& config_text, const std::string& where,
                                                  const std::string& config_where, Preset preset, const std::string& pattern);
std::unique_ptr<Tokenizer> tiktoken_tokenizer(const std::string& model_text, const std::string& config_text,
                                              const std::string& where, const std::string& config_where, Preset preset,
                                              const std::string& pattern);
std::unique_ptr<Tokenizer> load_dir_impl(const std::string& dir);
// A SentencePiece tokenizer.model (protobuf) of BPE type, read as transformers' LlamaConverter does.
std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& model_bytes, const std::string& config_text,
                                                   const std::string& where, const std::string& config_where);

// what() of an Error without its "[component] " prefix, control characters escaped, length capped.
std::string printable_message(const std::string& what, const std::string& component);
// Runs f(); a kiln::Error it throws comes back as one printable line (file contents such as
// regexes or token strings may hold newlines), at most a few hundred bytes long.
template <typename F>
auto one_line_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(e.component(), printable_message(e.what(), e.component()));
  }
}

// Preset pipelines (presets.cpp).
Pipeline preset_pipeline(Preset preset, const std::string& pattern, int32_t first_free_id, const Bpe& model,
                         const Json& config);
// The Llama 3.x regex (also the tiktoken default).
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;

}  // namespace kiln::tokenizer
