// Normalizers (see normalizer.h) and the JSON accessors shared by the tokenizer.json readers.
// Offsets are not tracked: kiln only needs the normalized text, not the alignment to the input.
#include "kiln/tokenizer/normalizer.h"

#include <functional>

#include "kiln/base/utf8.h"
#include "kiln/tokenizer/regex.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::tokenizer {

std::string json_str(const Json& j, const char* key, const std::string& where, const std::string& dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_string()) fail("tokenizer", "{}: \"{}\" must be a string, not {}", where, key, it->type_name());
  return it->get<std::string>();
}

bool json_bool(const Json& j, const char* key, const std::string& where, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail("tokenizer", "{}: \"{}\" must be true or false, not {}", where, key, it->type_name());
  return it->get<bool>();
}

int64_t json_int(const Json& j, const char* key, const std::string& where, int64_t dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number_integer()) fail("tokenizer", "{}: \"{}\" must be an integer, not {}", where, key, it->type_name());
  return it->get<int64_t>();
}

const std::string& json_type(const Json& j, const std::string& where) {
  if (!j.is_object()) fail("tokenizer", "{}: expected an object with a \"type\", got {}", where, j.type_name());
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) fail("tokenizer", "{}: object without a string \"type\"", where);
  return it->get_ref<const std::string&>();
}

Pattern parse_pattern(const Json& j, const std::string& where) {
  Pattern p;
  if (j.is_string()) {  // some writers store the bare string
    p.literal = j.get<std::string>();
    return p;
  }
  if (!j.is_object()) fail("tokenizer", "{}: \"pattern\" must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  if (auto it = j.find("String"); it != j.end() && it->is_string()) {
    p.literal = it->get<std::string>();
  } else if (auto r = j.find("Regex"); r != j.end() && r->is_string()) {
    p.regex = std::make_shared<Regex>(r->get<std::string>(), where);
  } else {
    fail("tokenizer", "{}: \"pattern\" must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  }
  return p;
}

void for_each_match(const Pattern& p, std::string_view s, const std::function<void(size_t, size_t)>& on_match) {
  if (p.regex) {
    p.regex->find_all(s, on_match);
    return;
  }
  if (p.literal.empty()) return;  // HF: an empty literal never matches
  size_t pos = 0;
  while ((pos = s.find(p.literal, pos)) != std::string_view::npos) {
    on_match(pos, pos + p.literal.size());
    pos += p.literal.size();
  }
}

std::string replace_all(const Pattern& p, std::string_view s, std::string_view with) {
  if (p.regex) return p.regex->replace_all(s, with);
  std::string out;
  size_t prev = 0;
  for_each_match(p, s, [&](size_t a, size_t b) {
    out.append(s.substr(prev, a - prev));
    out.append(with);
    prev = b;
  });
  out.append(s.substr(prev));
  return out;
}

namespace {

class FormNormalizer : public Normalizer {
 public:
  explicit FormNormalizer(unicode::Form f) : form_(f) {}
  void normalize(std::string& s) const override { s = unicode::normalize(s, form_); }

 private:
  unicode::Form form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& s) const override { s = unicode::lowercase(s); }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t begin = 0, end = s.size();
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!unicode::is_whitespace(unicode::next_char(s, i))) break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!unicode::is_whitespace(unicode::next_char(s, i))) break;
        end = start;
      }
    }
    s = s.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// Removes non-spacing marks (HF applies it after an NFD/NFKD normalizer in the same Sequence).
class StripAccentsNormalizer : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      size_t start = i;
      uint32_t cp = unicode::next_char(s, i);
      if (!unicode::is_nonspacing_mark(cp)) out.append(s, start, i - start);
    }
    s = std::move(out);
  }
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  void normalize(std::string& s) const override { s = replace_all(pattern_, s, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend_);  // HF prepends to non-empty text only
  }

 private:
  std::string prepend_;
};

class ByteLevelNormalizer : public Normalizer {
 public:
  void normalize(std::string& s) const override { s = unicode::to_byte_level(s); }
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> items) : items_(std::move(items)) {}
  void normalize(std::string& s) const override {
    for (const auto& n : items_) n->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> items_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& where, int depth) {
  if (j.is_null()) return nullptr;
  if (depth > kMaxNesting) fail("tokenizer", "{}: normalizers nested deeper than {}", where, kMaxNesting);
  const std::string& type = json_type(j, where + " normalizer");
  std::string at = where + " normalizer " + type;
  if (type == "NFC") return std::make_unique<FormNormalizer>(unicode::Form::nfc);
  if (type == "NFD") return std::make_unique<FormNormalizer>(unicode::Form::nfd);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(unicode::Form::nfkc);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(unicode::Form::nfkd);
  // SentencePiece's precompiled charsmap is (nearly) NFKC; kiln does not read the binary map.
  if (type == "Precompiled") return std::make_unique<FormNormalizer>(unicode::Form::nfkc);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_bool(j, "strip_left", at, true), json_bool(j, "strip_right", at, true));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(json_str(j, "prepend", at));
  if (type == "Replace") {
    auto it = j.find("pattern");
    if (it == j.end()) fail("tokenizer", "{}: missing \"pattern\"", at);
    return std::make_unique<ReplaceNormalizer>(parse_pattern(*it, at), json_str(j, "content", at));
  }
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) fail("tokenizer", "{}: \"normalizers\" must be a list", at);
    std::vector<std::unique_ptr<Normalizer>> items;
    for (const auto& n : *it) {
      if (auto made = make_normalizer(n, where, depth + 1)) items.push_back(std::move(made));
    }
    if (items.empty()) return nullptr;
    return std::make_unique<SequenceNormalizer>(std::move(items));
  }
  fail("tokenizer", "{}: unsupported normalizer type \"{}\" (kiln reads NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
       "StripAccents, Replace, Prepend, ByteLevel, Precompiled, Sequence)", where, type);
}

}  // namespace kiln::tokenizer
