// Tokenizer::encode / decode and the accessors. Encoding follows HF `tokenizers`:
//   1. split the text on added tokens that match the raw text (normalized=false);
//   2. normalize each remaining piece, then split it on normalized added tokens;
//   3. pre-tokenize each remaining piece into words, and run BPE on every word;
//   4. put the post-processor's ids (BOS, ...) around the result.
#include "kiln/tokenizer/tokenizer.h"

#include "kiln/base/utf8.h"
#include "kiln/tokenizer/tokenizer_impl.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::tokenizer {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  // Only a hostile regex can throw here (backtracking limit); its message names the pattern.
  return one_line_errors([&] { return encode_impl(text, add_special_tokens); });
}

std::vector<int32_t> Tokenizer::encode_impl(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!utf8::valid(text)) {  // regexes and normalizers need valid UTF-8
    repaired = unicode::to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids = m.prefix_ids;

  std::vector<AddedVocab::Segment> raw_segments, norm_segments;
  std::vector<Piece> pieces;
  m.added.split(text, /*normalized=*/false, raw_segments);
  for (const auto& seg : raw_segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string piece(text.substr(seg.start, seg.end - seg.start));
    if (m.normalizer) m.normalizer->normalize(piece);
    norm_segments.clear();
    m.added.split(piece, /*normalized=*/true, norm_segments);
    for (const auto& sub : norm_segments) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      if (sub.end <= sub.start) continue;
      pieces.clear();
      pieces.push_back(Piece{piece.substr(sub.start, sub.end - sub.start), seg.start == 0 && sub.start == 0});
      if (m.pre_tokenizer) m.pre_tokenizer->split(pieces);
      for (const auto& p : pieces) m.model->tokenize(p.text, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* t = m.added.by_id(id)) {
      if (!(skip_special_tokens && t->special)) tokens.push_back(t->content);
    } else if (const std::string* s = m.model->id_to_token(id)) {
      tokens.push_back(*s);
    }
  }
  std::string out;
  if (m.decoder) {
    m.decoder->decode_chain(tokens);
    for (const auto& t : tokens) out += t;
  } else {
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k) out += ' ';
      out += tokens[k];
    }
  }
  // Decoders keep valid UTF-8 except for hostile vocabularies; make the promise hold regardless.
  if (!utf8::valid(out)) out = unicode::to_valid_utf8(out);
  return out;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
bool Tokenizer::is_special(int32_t id) const { return impl_->added.is_special(id); }
const nlohmann::json& Tokenizer::config() const { return impl_->config; }
const std::vector<int32_t>& Tokenizer::prefix_ids() const { return impl_->prefix_ids; }
const std::vector<int32_t>& Tokenizer::suffix_ids() const { return impl_->suffix_ids; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.by_content(token)) return id;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* t = impl_->added.by_id(id)) return t->content;
  if (const std::string* s = impl_->model->id_to_token(id)) return *s;
  return "";
}

}  // namespace kiln::tokenizer
