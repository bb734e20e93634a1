// StreamDecoder: incremental detokenization by windowed decode. The window starts at the tokens that
// were printed last (their context fixes SentencePiece's leading-space strip and byte-fallback groups):
//   text = decode(ids[prefix, end)); new = text minus decode(ids[prefix, read)).
// New text is held back while it ends in U+FFFD, which is how an unfinished UTF-8 character (byte-level
// or byte-fallback) decodes; it is released once the character completes, or by flush().
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::tokenizer {

namespace {
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens) : tok_(tok), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  std::span<const int32_t> window(ids_.data() + prefix_, ids_.size() - prefix_);
  std::string text = tok_.decode(window, skip_special_);
  if (text.size() <= prefix_text_.size() || ends_with_replacement(text)) return "";
  std::string out;
  if (text.compare(0, prefix_text_.size(), prefix_text_) == 0) {
    out = text.substr(prefix_text_.size());
  } else {
    // The window disagrees with what it printed before (a decoder with long-range effects):
    // fall back to the full decode and print what follows the text printed so far.
    std::string full = tok_.decode(ids_, skip_special_);
    if (full.compare(0, printed_.size(), printed_) == 0) {
      out = full.substr(printed_.size());
    } else {
      // Printed text can not be taken back (e.g. a byte-fallback group that turned invalid later):
      // go on with what the window adds after the part it shares with the printed context.
      size_t common = 0;
      while (common < text.size() && common < prefix_text_.size() && text[common] == prefix_text_[common]) ++common;
      while (common > 0 && (static_cast<uint8_t>(text[common]) & 0xC0) == 0x80) --common;
      out = text.substr(common);
    }
  }
  prefix_ = read_;
  read_ = ids_.size();
  prefix_text_ = tok_.decode(std::span<const int32_t>(ids_.data() + prefix_, read_ - prefix_), skip_special_);
  printed_ += out;
  return out;
}

std::string StreamDecoder::flush() {
  std::string full = tok_.decode(ids_, skip_special_);
  std::string out;
  if (full.size() > printed_.size() && full.compare(0, printed_.size(), printed_) == 0) out = full.substr(printed_.size());
  printed_ += out;
  if (read_ < ids_.size()) {  // keep the last tokens as context, as push() does
    prefix_ = read_;
    read_ = ids_.size();
    prefix_text_ = tok_.decode(std::span<const int32_t>(ids_.data() + prefix_, read_ - prefix_), skip_special_);
  }
  return out;
}

}  // namespace kiln::tokenizer
