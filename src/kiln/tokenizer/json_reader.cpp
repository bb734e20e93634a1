// tokenizer.json SAX reader (see json_reader.h). A stack of frames mirrors the nesting: DOM frames
// point at the Json node being filled; the vocab / merges / merge-pair frames fill the tables instead.
// Child pointers stay valid because a parent is only appended to after its open child is closed.
#include "kiln/tokenizer/json_reader.h"

namespace kiln::tokenizer {

namespace {

class Reader : public nlohmann::json_sax<Json> {
 public:
  Reader(TokenizerJsonParts& out, const std::string& where) : out_(out), where_(where) {}

  bool null() override { return scalar(Json(nullptr)); }
  bool boolean(bool v) override { return scalar(Json(v)); }
  bool number_integer(number_integer_t v) override {
    if (in(Kind::vocab)) return vocab_id(v);
    return scalar(Json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (in(Kind::vocab)) return vocab_id(v > static_cast<number_unsigned_t>(kMaxTokenId) ? kMaxTokenId : static_cast<int64_t>(v));
    return scalar(Json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return scalar(Json(v)); }
  bool binary(binary_t&) override { return scalar(Json()); }
  bool string(string_t& v) override {
    if (in(Kind::merges)) {
      out_.merges.push_back({std::move(v), std::string(), false});
      return true;
    }
    if (in(Kind::merge_pair)) {
      if (pair_.size() >= 2) fail("tokenizer", "{}: a merge must be \"a b\" or [a, b] (a longer list)", where_);
      pair_.push_back(std::move(v));
      return true;
    }
    return scalar(Json(std::move(v)));
  }

  bool start_object(std::size_t) override {
    if (in(Kind::vocab) || in(Kind::merges) || in(Kind::merge_pair)) bad_entry("an object");
    if (is_model_key("vocab")) {
      out_.has_vocab = true;
      stack_.push_back({Kind::vocab, nullptr, {}, false});
      return true;
    }
    bool model = stack_.size() == 1 && stack_.back().key == "model";
    Json* node = put(Json::object());
    stack_.push_back({Kind::dom, node, {}, model});
    return true;
  }
  bool key(string_t& k) override {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (in(Kind::vocab) || in(Kind::merge_pair)) bad_entry("a list");
    if (in(Kind::merges)) {
      pair_.clear();
      stack_.push_back({Kind::merge_pair, nullptr, {}, false});
      return true;
    }
    if (is_model_key("merges")) {
      stack_.push_back({Kind::merges, nullptr, {}, false});
      return true;
    }
    Json* node = put(Json::array());
    stack_.push_back({Kind::dom, node, {}, false});
    return true;
  }
  bool end_array() override {
    if (in(Kind::merge_pair)) {
      if (pair_.size() != 2) fail("tokenizer", "{}: a merge must be \"a b\" or [a, b], not a list of {}", where_, pair_.size());
      out_.merges.push_back({std::move(pair_[0]), std::move(pair_[1]), true});
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    std::string what = ex.what();
    auto p = what.find("parse error");
    fail("tokenizer", "{}: invalid JSON: {}", where_, p == std::string::npos ? what : what.substr(p));
  }

 private:
  enum class Kind { dom, vocab, merges, merge_pair };
  struct Frame {
    Kind kind;
    Json* node;       // dom frames: the object or array being filled
    std::string key;  // objects: the key of the value that comes next
    bool is_model;    // the top-level "model" object
  };

  bool in(Kind k) const { return !stack_.empty() && stack_.back().kind == k; }
  bool is_model_key(const char* k) const {
    return !stack_.empty() && stack_.back().is_model && stack_.back().key == k;
  }
  [[noreturn]] void bad_entry(const char* what) const {
    if (in(Kind::vocab)) fail("tokenizer", "{}: vocab id must be an integer, not {}", where_, what);
    fail("tokenizer", "{}: a merge must be \"a b\" or [a, b], not {}", where_, what);
  }
  bool vocab_id(int64_t id) {
    if (id < 0 || id >= kMaxTokenId) fail("tokenizer", "{}: vocab id {} is out of range (0..{})", where_, id, kMaxTokenId - 1);
    out_.vocab.insert_or_assign(std::move(stack_.back().key), static_cast<int32_t>(id));
    return true;
  }
  bool scalar(Json&& v) {
    if (in(Kind::vocab)) bad_entry(v.type_name());
    if (in(Kind::merges) || in(Kind::merge_pair)) bad_entry(v.type_name());
    put(std::move(v));
    return true;
  }
  // Stores v where the parser is (object member, list element, or the document) and returns it.
  Json* put(Json&& v) {
    if (stack_.empty()) {
      out_.doc = std::move(v);
      return &out_.doc;
    }
    Frame& f = stack_.back();
    if (f.node->is_object()) {
      Json& slot = (*f.node)[f.key];
      slot = std::move(v);
      return &slot;
    }
    f.node->push_back(std::move(v));
    return &f.node->back();
  }

  TokenizerJsonParts& out_;
  const std::string& where_;
  std::vector<Frame> stack_;
  std::vector<std::string> pair_;
};

}  // namespace

TokenizerJsonParts read_tokenizer_json(const std::string& text, const std::string& where) {
  TokenizerJsonParts parts;
  Reader reader(parts, where);
  Json::sax_parse(text, &reader);
  return parts;
}

}  // namespace kiln::tokenizer
