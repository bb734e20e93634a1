// Pre-tokenizers (see pre_tokenizer.h). Splitting follows HF `tokenizers`: a pattern yields a list of
// (range, is_match) covering the piece, a behaviour (Removed, Isolated, MergedWithPrevious,
// MergedWithNext, Contiguous) turns it into ranges to keep, and empty ranges are dropped.
#include "kiln/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <functional>

#include "kiln/tokenizer/normalizer.h"
#include "kiln/tokenizer/regex.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::tokenizer {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior parse_behavior(const Json& j, const std::string& where, Behavior dflt) {
  std::string b = json_str(j, "behavior", where, "");
  if (b.empty()) return dflt;
  if (b == "Removed") return Behavior::removed;
  if (b == "Isolated") return Behavior::isolated;
  if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (b == "MergedWithNext") return Behavior::merged_with_next;
  if (b == "Contiguous") return Behavior::contiguous;
  fail("tokenizer", "{}: unknown split behavior \"{}\" (Removed, Isolated, MergedWithPrevious, MergedWithNext, "
       "Contiguous)", where, b);
}

struct Span {
  size_t start, end;
  bool is_match;
};

// Turns the match list of one piece into output pieces according to the behaviour (HF's
// NormalizedString::split): a match "merges" into its neighbour by widening that neighbour's range.
void emit_splits(const Piece& piece, const std::vector<Span>& spans, Behavior behavior, std::vector<Piece>& out) {
  struct Keep {
    size_t start, end;
    bool remove;
  };
  std::vector<Keep> keep;
  keep.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::removed:
      for (const auto& s : spans) keep.push_back({s.start, s.end, s.is_match});
      break;
    case Behavior::isolated:
      for (const auto& s : spans) keep.push_back({s.start, s.end, false});
      break;
    case Behavior::contiguous:  // a run of matches or of non-matches is one piece
    case Behavior::merged_with_previous:
      for (const auto& s : spans) {
        bool merge = behavior == Behavior::contiguous ? s.is_match == previous_match : s.is_match && !previous_match;
        if (merge && !keep.empty()) keep.back().end = s.end;
        else keep.push_back({s.start, s.end, false});
        previous_match = s.is_match;
      }
      break;
    case Behavior::merged_with_next:
      for (size_t k = spans.size(); k-- > 0;) {
        const auto& s = spans[k];
        if (s.is_match && !previous_match && !keep.empty()) keep.back().start = s.start;
        else keep.push_back({s.start, s.end, false});
        previous_match = s.is_match;
      }
      std::reverse(keep.begin(), keep.end());
      break;
  }
  for (const auto& k : keep) {
    if (k.remove || k.end <= k.start) continue;
    out.push_back({piece.text.substr(k.start, k.end - k.start), piece.at_start && k.start == 0});
  }
}

// (range, is_match) list for a matcher that reports match ranges left to right; gaps are non-matches.
std::vector<Span> spans_from_matches(std::string_view s, const std::function<void(const std::function<void(size_t, size_t)>&)>& matcher,
                                     bool invert) {
  std::vector<Span> spans;
  size_t prev = 0;
  matcher([&](size_t start, size_t end) {
    if (start < prev) return;
    if (prev != start) spans.push_back({prev, start, invert});
    spans.push_back({start, end, !invert});
    prev = end;
  });
  if (prev != s.size()) spans.push_back({prev, s.size(), invert});
  return spans;
}

// Same for a per-character predicate: every matching character is its own match.
std::vector<Span> spans_from_predicate(std::string_view s, bool (*pred)(uint32_t)) {
  std::vector<Span> spans;
  size_t prev = 0, i = 0;
  while (i < s.size()) {
    size_t start = i;
    uint32_t cp = unicode::next_char(s, i);
    if (pred(cp)) {
      if (prev < start) spans.push_back({prev, start, false});
      spans.push_back({start, i, true});
      prev = i;
    }
  }
  if (prev < s.size()) spans.push_back({prev, s.size(), false});
  return spans;
}

// Applies `split_one` to every piece, collecting the results in order.
template <typename F>
void split_each(std::vector<Piece>& pieces, F&& split_one) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (const auto& p : pieces) {
    if (!p.text.empty()) split_one(p, out);
  }
  pieces.swap(out);
}

class SplitPre : public PreTokenizer {
 public:
  SplitPre(Pattern p, Behavior b, bool invert) : pattern_(std::move(p)), behavior_(b), invert_(invert) {}
  void split(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      auto spans = spans_from_matches(p.text, [&](const auto& cb) { for_each_match(pattern_, p.text, cb); }, invert_);
      emit_splits(p, spans, behavior_, out);
    });
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class PredicatePre : public PreTokenizer {
 public:
  PredicatePre(bool (*pred)(uint32_t), Behavior b) : pred_(pred), behavior_(b) {}
  void split(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      emit_splits(p, spans_from_predicate(p.text, pred_), behavior_, out);
    });
  }

 private:
  bool (*pred_)(uint32_t);
  Behavior behavior_;
};

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void split(std::vector<Piece>& pieces) const override {
    static const Regex gpt2(kGpt2Pattern, "ByteLevel pre-tokenizer");
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      Piece q = p;
      if (add_prefix_space_ && q.text[0] != ' ') q.text = std::string(" ").append(q.text);
      size_t first = out.size();
      if (use_regex_) {
        auto spans = spans_from_matches(q.text, [&](const auto& cb) { gpt2.find_all(q.text, cb); }, false);
        emit_splits(q, spans, Behavior::isolated, out);
      } else {
        out.push_back(std::move(q));
      }
      for (size_t k = first; k < out.size(); ++k) out[k].text = unicode::to_byte_level(out[k].text);
    });
  }

 private:
  bool add_prefix_space_, use_regex_;
};

enum class Prepend { always, first, never };

class MetaspacePre : public PreTokenizer {
 public:
  MetaspacePre(std::string replacement, Prepend scheme, bool split, bool dummy_prefix)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split), dummy_prefix_(dummy_prefix) {}
  void split(std::vector<Piece>& pieces) const override {
    Pattern rep;
    rep.literal = replacement_;
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      Piece q{std::string(), p.at_start};
      q.text.reserve(p.text.size() + 8);
      for (char c : p.text) {
        if (c == ' ') q.text += replacement_;
        else q.text += c;
      }
      // HF checks after spaces became ▁, so " Hello" gives "▁Hello". SentencePiece's add_dummy_prefix
      // (dummy_prefix_, used for tokenizer.model files) checks the text itself: "▁▁Hello".
      const std::string& seen = dummy_prefix_ ? p.text : q.text;
      bool starts = seen.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == Prepend::always || (scheme_ == Prepend::first && p.at_start))) {
        q.text = std::string(replacement_).append(q.text);
      }
      if (!split_) {
        out.push_back(std::move(q));
        return;
      }
      auto spans = spans_from_matches(q.text, [&](const auto& cb) { for_each_match(rep, q.text, cb); }, false);
      emit_splits(q, spans, Behavior::merged_with_next, out);
    });
  }

 private:
  std::string replacement_;
  Prepend scheme_;
  bool split_;
  bool dummy_prefix_;
};

class SequencePre : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> items) : items_(std::move(items)) {}
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& p : items_) p->split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> items_;
};

bool is_ws(uint32_t cp) { return unicode::is_whitespace(cp); }
bool is_punc(uint32_t cp) { return unicode::is_punctuation(cp); }
bool is_num(uint32_t cp) { return unicode::is_numeric(cp); }

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& where, int depth) {
  if (j.is_null()) return nullptr;
  if (depth > kMaxNesting) fail("tokenizer", "{}: pre_tokenizers nested deeper than {}", where, kMaxNesting);
  const std::string& type = json_type(j, where + " pre_tokenizer");
  std::string at = where + " pre_tokenizer " + type;
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPre>(json_bool(j, "add_prefix_space", at, true), json_bool(j, "use_regex", at, true));
  }
  if (type == "Split") {
    auto it = j.find("pattern");
    if (it == j.end()) fail("tokenizer", "{}: missing \"pattern\"", at);
    return std::make_unique<SplitPre>(parse_pattern(*it, at), parse_behavior(j, at, Behavior::isolated),
                                      json_bool(j, "invert", at, false));
  }
  if (type == "Digits") {
    return std::make_unique<PredicatePre>(
        is_num, json_bool(j, "individual_digits", at, false) ? Behavior::isolated : Behavior::contiguous);
  }
  if (type == "Metaspace") {
    std::string rep = json_str(j, "replacement", at, "\xE2\x96\x81");
    if (rep.empty()) fail("tokenizer", "{}: empty \"replacement\"", at);
    Prepend scheme = Prepend::always;
    std::string s = json_str(j, "prepend_scheme", at, "");
    if (s == "first") scheme = Prepend::first;
    else if (s == "never") scheme = Prepend::never;
    else if (s.empty() && !json_bool(j, "add_prefix_space", at, true)) scheme = Prepend::never;  // older files
    // "kiln_dummy_prefix" is kiln's own key (SentencePiece semantics for tokenizer.model files).
    return std::make_unique<MetaspacePre>(rep, scheme, json_bool(j, "split", at, true),
                                          json_bool(j, "kiln_dummy_prefix", at, false));
  }
  if (type == "Whitespace") {
    // HF: keep the matches of \w+|[^\w\s]+ (Oniguruma's Unicode \w: letters, marks, digits, connectors).
    Pattern p;
    p.regex = std::make_shared<Regex>(R"([\p{L}\p{M}\p{Nd}\p{Pc}]+|[^\p{L}\p{M}\p{Nd}\p{Pc}\s]+)", at);
    return std::make_unique<SplitPre>(std::move(p), Behavior::removed, true);
  }
  if (type == "WhitespaceSplit") return std::make_unique<PredicatePre>(is_ws, Behavior::removed);
  if (type == "Punctuation") return std::make_unique<PredicatePre>(is_punc, parse_behavior(j, at, Behavior::isolated));
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> items;
    items.push_back(std::make_unique<PredicatePre>(is_ws, Behavior::removed));
    items.push_back(std::make_unique<PredicatePre>(is_punc, Behavior::isolated));
    return std::make_unique<SequencePre>(std::move(items));
  }
  if (type == "CharDelimiterSplit") {
    std::string d = json_str(j, "delimiter", at, "");
    if (d.empty()) fail("tokenizer", "{}: missing \"delimiter\"", at);
    Pattern p;
    p.literal = d;
    return std::make_unique<SplitPre>(std::move(p), Behavior::removed, false);
  }
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) fail("tokenizer", "{}: \"pretokenizers\" must be a list", at);
    std::vector<std::unique_ptr<PreTokenizer>> items;
    for (const auto& p : *it) {
      if (auto made = make_pre_tokenizer(p, where, depth + 1)) items.push_back(std::move(made));
    }
    return std::make_unique<SequencePre>(std::move(items));
  }
  fail("tokenizer", "{}: unsupported pre_tokenizer type \"{}\" (kiln reads ByteLevel, Split, Digits, Metaspace, "
       "Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit, Sequence)", where, type);
}

}  // namespace kiln::tokenizer
