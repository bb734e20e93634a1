// SentencePiece tokenizer.model (a protobuf ModelProto) of BPE type, read the way transformers'
// LlamaConverter turns it into a tokenizer.json: pieces are the vocabulary, merges follow piece scores
// (higher first), control/unknown pieces are special tokens, user-defined pieces are added tokens, and
// the pipeline is Metaspace (prepend "first") + byte-fallback decoding. A small bounds-checked wire
// reader replaces a protobuf dependency; only the fields below are read.
#include <algorithm>
#include <cstring>

#include "kiln/tokenizer/tokenizer_impl.h"

namespace kiln::tokenizer {

namespace {

// Protobuf wire format: (field << 3 | wire type) keys, varints, length-delimited bytes, fixed 32/64.
class WireReader {
 public:
  explicit WireReader(std::string_view s) : p_(s.data()), end_(s.data() + s.size()) {}
  bool ok() const { return ok_; }
  bool done() const { return p_ >= end_ || !ok_; }
  bool next(uint32_t& field, uint32_t& wire) {
    uint64_t key = varint();
    field = static_cast<uint32_t>(key >> 3);
    wire = static_cast<uint32_t>(key & 7);
    return ok_;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) return bad();
      uint8_t b = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    return bad();
  }
  std::string_view bytes() {
    uint64_t n = varint();
    if (!ok_ || n > static_cast<uint64_t>(end_ - p_)) return bad(), std::string_view();
    std::string_view s(p_, n);
    p_ += n;
    return s;
  }
  float fixed32_float() {
    if (end_ - p_ < 4) return bad(), 0.0f;
    uint32_t u;
    std::memcpy(&u, p_, 4);  // little-endian on every platform kiln builds for
    p_ += 4;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0: varint(); break;
      case 1: advance(8); break;
      case 2: bytes(); break;
      case 5: advance(4); break;
      default: bad();
    }
  }

 private:
  uint64_t bad() {
    ok_ = false;
    p_ = end_;
    return 0;
  }
  void advance(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) bad();
    else p_ += n;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct SpPiece {
  std::string piece;
  float score = 0;
  int type = kNormal;
};

struct SpModel {
  std::vector<SpPiece> pieces;
  int model_type = 1;  // 1 unigram (the proto default), 2 BPE
  bool byte_fallback = false;
  std::string unk_piece = "<unk>", bos_piece = "<s>", eos_piece = "</s>";
  std::string normalizer_name;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
};

SpModel parse_model(std::string_view data, const std::string& where) {
  SpModel m;
  WireReader r(data);
  uint32_t field, wire;
  auto need = [&](bool cond) {
    if (!cond || !r.ok()) fail("tokenizer", "{}: not a SentencePiece model (malformed protobuf)", where);
  };
  while (!r.done() && r.next(field, wire)) {
    if (field == 1 && wire == 2) {  // repeated SentencePiece pieces
      WireReader pr(r.bytes());
      SpPiece sp;
      uint32_t f, w;
      while (!pr.done() && pr.next(f, w)) {
        if (f == 1 && w == 2) sp.piece = std::string(pr.bytes());
        else if (f == 2 && w == 5) sp.score = pr.fixed32_float();
        else if (f == 3 && w == 0) sp.type = static_cast<int>(pr.varint());
        else pr.skip(w);
      }
      need(pr.ok());
      m.pieces.push_back(std::move(sp));
    } else if (field == 2 && wire == 2) {  // TrainerSpec
      WireReader tr(r.bytes());
      uint32_t f, w;
      while (!tr.done() && tr.next(f, w)) {
        if (f == 3 && w == 0) m.model_type = static_cast<int>(tr.varint());
        else if (f == 35 && w == 0) m.byte_fallback = tr.varint() != 0;
        else if (f == 45 && w == 2) m.unk_piece = std::string(tr.bytes());
        else if (f == 46 && w == 2) m.bos_piece = std::string(tr.bytes());
        else if (f == 47 && w == 2) m.eos_piece = std::string(tr.bytes());
        else tr.skip(w);
      }
      need(tr.ok());
    } else if (field == 3 && wire == 2) {  // NormalizerSpec
      WireReader nr(r.bytes());
      uint32_t f, w;
      while (!nr.done() && nr.next(f, w)) {
        if (f == 1 && w == 2) m.normalizer_name = std::string(nr.bytes());
        else if (f == 3 && w == 0) m.add_dummy_prefix = nr.varint() != 0;
        else if (f == 4 && w == 0) m.remove_extra_whitespaces = nr.varint() != 0;
        else nr.skip(w);
      }
      need(nr.ok());
    } else {
      r.skip(wire);
    }
  }
  need(r.ok() && !m.pieces.empty());
  return m;
}

}  // namespace

std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& model_bytes, const std::string& config_text,
                                                   const std::string& where, const std::string& config_where) {
  SpModel sp = parse_model(model_bytes, where);
  if (sp.model_type != 2) {
    fail("tokenizer", "{}: SentencePiece model type {} is not supported (kiln reads BPE models; a unigram model "
         "needs its tokenizer.json)", where, sp.model_type);
  }
  if (static_cast<int64_t>(sp.pieces.size()) > kMaxTokenId) fail("tokenizer", "{}: too many pieces", where);
  TokenMap vocab;
  vocab.reserve(sp.pieces.size());
  for (size_t id = 0; id < sp.pieces.size(); ++id) vocab.emplace(sp.pieces[id].piece, static_cast<int32_t>(id));
  BpeOptions opt;
  opt.byte_fallback = sp.byte_fallback;
  opt.unk_token = sp.unk_piece;
  opt.fuse_unk = true;
  auto bpe = std::make_unique<Bpe>(std::move(vocab), opt, where);

  // Merge priority: SentencePiece merges the pair whose result has the highest score.
  std::vector<int32_t> ranked;
  for (size_t id = 0; id < sp.pieces.size(); ++id) {
    int t = sp.pieces[id].type;
    if (t == kNormal || t == kUserDefined) ranked.push_back(static_cast<int32_t>(id));
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](int32_t a, int32_t b) { return sp.pieces[a].score > sp.pieces[b].score; });
  bpe->set_merges_from_ranks(ranked);

  Pipeline p;
  Json& j = p.json;
  const std::string meta = "\xE2\x96\x81";  // ▁
  Json norms = Json::array();
  if (sp.normalizer_name.rfind("nmt_nfkc", 0) == 0 || sp.normalizer_name == "nfkc") norms.push_back({{"type", "NFKC"}});
  if (sp.remove_extra_whitespaces) {
    norms.push_back({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}});
    norms.push_back({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}});
  }
  if (!norms.empty()) j["normalizer"] = {{"type", "Sequence"}, {"normalizers", norms}};
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", meta},
                        {"prepend_scheme", sp.add_dummy_prefix ? "first" : "never"}, {"split", false},
                        {"kiln_dummy_prefix", true}};
  Json decoders = Json::array({Json{{"type", "Replace"}, {"pattern", {{"String", meta}}}, {"content", " "}},
                               Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}}});
  if (sp.add_dummy_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  Json added = Json::array();
  for (size_t id = 0; id < sp.pieces.size(); ++id) {
    int t = sp.pieces[id].type;
    if (t != kUnknown && t != kControl && t != kUserDefined) continue;
    added.push_back({{"id", id}, {"content", sp.pieces[id].piece}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", t != kUserDefined}});
  }
  j["added_tokens"] = added;
  if (auto bos = bpe->token_to_id(sp.bos_piece)) {
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", Json::array({Json{{"SpecialToken", {{"id", sp.bos_piece}, {"type_id", 0}}}},
                                                   Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                           {"special_tokens", {{sp.bos_piece, {{"id", sp.bos_piece}, {"ids", {*bos}}}}}}};
  }
  p.default_bos = sp.bos_piece;
  p.default_eos = sp.eos_piece;
  return assemble(std::move(bpe), p, config_text, where, config_where);
}

std::unique_ptr<Tokenizer> Tokenizer::from_sentencepiece(const std::string& model_bytes,
                                                         const std::string& tokenizer_config_json, const std::string& where) {
  return one_line_errors(
      [&] { return sentencepiece_tokenizer(model_bytes, tokenizer_config_json, where, where + " (tokenizer_config.json)"); });
}

}  // namespace kiln::tokenizer
