// The tokenizer of a model folder: tokenizer.json (HF `tokenizers` semantics: normalizer,
// pre-tokenizer, BPE model, post-processor, decoder, added tokens), or vocab.json + merges.txt, or a
// tiktoken tokenizer.model; plus tokenizer_config.json for BOS/EOS. StreamDecoder turns ids into
// text incrementally without ever printing half a UTF-8 character.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tokenizer {

// Pre-tokenization presets for files that do not describe it themselves (vocab.json + merges.txt,
// tiktoken models). automatic: Qwen2 when tokenizer_config.json names a Qwen2 tokenizer class (or the
// vocabulary has over 100k tokens and no config says otherwise), else GPT-2; tiktoken: Llama 3.
enum class Preset { automatic, gpt2, qwen2, llama3 };

class Tokenizer {
 public:
  // A model folder: tokenizer.json (+ tokenizer_config.json when present), else vocab.json + merges.txt,
  // else a tiktoken tokenizer.model. Missing files -> kiln::Error
  // "[tokenizer] <dir>: no tokenizer.json (or vocab.json+merges.txt) found ...".
  static std::unique_ptr<Tokenizer> load_dir(const std::string& dir);
  // From in-memory file contents (used for the model embedded in the binary); config may be "".
  // `where` names the source in error messages.
  static std::unique_ptr<Tokenizer> from_json(const std::string& tokenizer_json, const std::string& tokenizer_config_json,
                                              const std::string& where);
  // A byte-level BPE from a vocab.json + merges.txt pair. `pattern`, when not empty, replaces the
  // preset's pre-tokenizer regex.
  static std::unique_ptr<Tokenizer> from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt,
                                                      const std::string& tokenizer_config_json, const std::string& where,
                                                      Preset preset = Preset::automatic, const std::string& pattern = "");
  // A tiktoken BPE file (lines "base64(token) rank"; rank = id = merge priority) over raw bytes.
  static std::unique_ptr<Tokenizer> from_tiktoken(const std::string& model_text, const std::string& tokenizer_config_json,
                                                  const std::string& where, Preset preset = Preset::llama3,
                                                  const std::string& pattern = "");

  // A SentencePiece tokenizer.model (protobuf, BPE type), read as transformers' Llama converter does.
  static std::unique_ptr<Tokenizer> from_sentencepiece(const std::string& model_bytes,
                                                       const std::string& tokenizer_config_json, const std::string& where);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Thread-safe. add_special_tokens: apply the post-processor (BOS etc.). Invalid UTF-8 in `text`
  // is replaced by U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ids outside the vocabulary are skipped. The result is valid UTF-8. (clean_up_tokenization_spaces
  // is not applied: it would break streaming and round trips.)
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;

  int32_t vocab_size() const;                     // largest id + 1 over vocab and added tokens
  std::optional<int32_t> bos_id() const;          // from tokenizer_config.json bos_token (string or {content}), else none
  std::optional<int32_t> eos_id() const;
  const std::string& bos_token() const;           // "" when absent
  const std::string& eos_token() const;
  bool is_special(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;      // raw vocab string ("" for unknown ids)
  const nlohmann::json& config() const;           // parsed tokenizer_config.json (empty object when absent)
  // Ids the post-processor puts before / after one sequence (e.g. {bos} / {}).
  const std::vector<int32_t>& prefix_ids() const;
  const std::vector<int32_t>& suffix_ids() const;

  // Internal: the loaders build an Impl (tokenizer_impl.h) and wrap it.
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);

 private:
  std::vector<int32_t> encode_impl(std::string_view text, bool add_special_tokens) const;
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: push ids one at a time, get back the newly completed text. The pushes plus
// flush() add up to exactly decode(all ids so far); no push returns half a UTF-8 character.
// It decodes a short window (the last printed tokens plus the new ones) and prints the difference,
// which keeps SentencePiece leading-space stripping and byte-fallback groups right.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = true);
  std::string push(int32_t id);
  // Whatever is held back (an unfinished character comes out as U+FFFD, as decode() prints it).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // every id pushed so far
  size_t prefix_ = 0;         // window start: ids_[prefix_, read_) were printed and give context
  size_t read_ = 0;           // ids_[read_, end) are not printed yet
  std::string prefix_text_;   // decode(ids_[prefix_, read_))
  std::string printed_;       // everything returned so far (for the rare full re-decode)
};

}  // namespace kiln::tokenizer
