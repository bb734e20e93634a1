// Decoders (see decoder.h), following the decode_chain semantics of HF `tokenizers`.
#include "kiln/tokenizer/decoder.h"

#include "kiln/tokenizer/normalizer.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::tokenizer {

namespace {
const char* const kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD
}

std::string byte_level_decode(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const auto& t : tokens) {
    size_t start = bytes.size();
    bool all_mapped = true;
    for (size_t i = 0; i < t.size();) {
      int b = unicode::char_byte(unicode::next_char(t, i));
      if (b < 0) {
        all_mapped = false;
        break;
      }
      bytes += static_cast<char>(b);
    }
    if (!all_mapped) {  // not a byte-level token (e.g. an added token with spaces): its own bytes
      bytes.resize(start);
      bytes += t;
    }
  }
  return unicode::to_valid_utf8(bytes);
}

namespace {

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string s = byte_level_decode(tokens);
    tokens.assign(1, std::move(s));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first) : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && strip_first_)) out += ' ';  // HF drops every ▁ of the first token
          k += replacement_.size();
        } else {
          out += t[k++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = replace_all(pattern_, t, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// <0xXX> tokens in a row are gathered; valid UTF-8 becomes text, anything else one U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    size_t pending_n = 0;
    auto flush = [&]() {
      if (!pending_n) return;
      if (unicode::to_valid_utf8(pending) == pending) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending_n; ++k) out.emplace_back(kReplacementChar);
      }
      pending.clear();
      pending_n = 0;
    };
    for (auto& t : tokens) {
      int byte = parse_byte(t);
      if (byte >= 0) {
        pending += static_cast<char>(byte);
        ++pending_n;
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens.swap(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_byte(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from every token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (content_.empty()) return;
    size_t c = content_.size();
    for (auto& t : tokens) {
      size_t begin = 0, end = t.size();
      for (size_t k = 0; k < start_ && end - begin >= c && t.compare(begin, c, content_) == 0; ++k) begin += c;
      for (size_t k = 0; k < stop_ && end - begin >= c && t.compare(end - c, c, content_) == 0; ++k) end -= c;
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

// Classic BPE with an end-of-word suffix: the suffix becomes a space (nothing on the last token).
class BpeSuffixDecoder : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (suffix_.empty()) return;
    Pattern p;
    p.literal = suffix_;
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = replace_all(p, tokens[i], i + 1 == tokens.size() ? "" : " ");
  }

 private:
  std::string suffix_;
};

// WordPiece: "##" continues the previous word; other tokens start a new word with a space.
class WordPieceDecoder : public Decoder {
 public:
  explicit WordPieceDecoder(std::string prefix) : prefix_(std::move(prefix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto& t = tokens[i];
      if (i == 0) continue;
      if (!prefix_.empty() && t.compare(0, prefix_.size(), prefix_) == 0) t.erase(0, prefix_.size());
      else t = std::string(" ").append(t);  // (not insert(0): GCC 12 -Wrestrict false positive)
    }
  }

 private:
  std::string prefix_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> items) : items_(std::move(items)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& d : items_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> items_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& where, int depth) {
  if (j.is_null()) return nullptr;
  if (depth > kMaxNesting) fail("tokenizer", "{}: decoders nested deeper than {}", where, kMaxNesting);
  const std::string& type = json_type(j, where + " decoder");
  std::string at = where + " decoder " + type;
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    std::string rep = json_str(j, "replacement", at, "\xE2\x96\x81");
    if (rep.empty()) fail("tokenizer", "{}: empty \"replacement\"", at);
    std::string scheme = json_str(j, "prepend_scheme", at, "");
    bool strip_first = scheme.empty() ? json_bool(j, "add_prefix_space", at, true) : scheme != "never";
    return std::make_unique<MetaspaceDecoder>(rep, strip_first);
  }
  if (type == "Replace") {
    auto it = j.find("pattern");
    if (it == j.end()) fail("tokenizer", "{}: missing \"pattern\"", at);
    return std::make_unique<ReplaceDecoder>(parse_pattern(*it, at), json_str(j, "content", at));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    int64_t start = json_int(j, "start", at, 0), stop = json_int(j, "stop", at, 0);
    if (start < 0 || stop < 0) fail("tokenizer", "{}: negative \"start\"/\"stop\"", at);
    return std::make_unique<StripDecoder>(json_str(j, "content", at, " "), static_cast<size_t>(start),
                                          static_cast<size_t>(stop));
  }
  if (type == "BPEDecoder") return std::make_unique<BpeSuffixDecoder>(json_str(j, "suffix", at, "</w>"));
  if (type == "WordPiece") return std::make_unique<WordPieceDecoder>(json_str(j, "prefix", at, "##"));
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) fail("tokenizer", "{}: \"decoders\" must be a list", at);
    std::vector<std::unique_ptr<Decoder>> items;
    for (const auto& d : *it) {
      if (auto made = make_decoder(d, where, depth + 1)) items.push_back(std::move(made));
    }
    return std::make_unique<SequenceDecoder>(std::move(items));
  }
  fail("tokenizer", "{}: unsupported decoder type \"{}\" (kiln reads ByteLevel, Metaspace, Replace, ByteFallback, Fuse, "
       "Strip, BPEDecoder, WordPiece, Sequence)", where, type);
}

}  // namespace kiln::tokenizer
