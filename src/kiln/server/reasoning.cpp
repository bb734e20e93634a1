// ReasoningSplitter: a small state machine over the held text. start: hold whitespace and a
// prefix of "<think>" until the output shows whether it opens a block. reasoning: emit up to the
// first "</think>", or else up to what could be trailing whitespace or the start of the tag.
// content: everything passes through (a later "<think>" is the answer's text).
#include "kiln/server/reasoning.h"

#include <algorithm>

namespace kiln::server {

namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Length of the longest suffix of s that is a proper prefix of tag.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(tag.size() - 1, s.size()); k > 0; --k)
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

}  // namespace

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(kClose);
  return close == std::string_view::npos || close < open;
}

ReasoningSplitter::Piece ReasoningSplitter::push(std::string_view text) {
  Piece out;
  held_ += text;
  for (;;) {
    if (skip_space_) {
      size_t n = 0;
      while (n < held_.size() && is_space(held_[n])) ++n;
      held_.erase(0, n);
      if (held_.empty()) return out;  // more whitespace may follow
      skip_space_ = false;
    }
    switch (state_) {
      case State::start: {
        size_t lead = 0;
        while (lead < held_.size() && is_space(held_[lead])) ++lead;
        std::string_view rest = std::string_view(held_).substr(lead);
        if (rest.size() >= kOpen.size() && rest.substr(0, kOpen.size()) == kOpen) {
          held_.erase(0, lead + kOpen.size());
          state_ = State::reasoning;
          skip_space_ = true;
          continue;
        }
        if (rest.size() < kOpen.size() && rest == kOpen.substr(0, rest.size())) return out;  // undecided
        state_ = State::content;
        continue;
      }
      case State::reasoning: {
        const size_t close = held_.find(kClose);
        if (close != std::string::npos) {
          size_t end = close;
          while (end > 0 && is_space(held_[end - 1])) --end;
          out.reasoning += held_.substr(0, end);
          held_.erase(0, close + kClose.size());
          state_ = State::content;
          skip_space_ = true;
          continue;
        }
        size_t keep = partial_tag(held_, kClose);
        size_t end = held_.size() - keep;
        while (end > 0 && is_space(held_[end - 1])) --end;
        out.reasoning += held_.substr(0, end);
        held_.erase(0, end);
        return out;
      }
      case State::content:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
}

ReasoningSplitter::Piece ReasoningSplitter::flush() {
  Piece out;
  if (state_ == State::reasoning) {
    size_t end = held_.size();
    while (end > 0 && is_space(held_[end - 1])) --end;
    out.reasoning = held_.substr(0, end);
  } else if (!skip_space_) {
    out.content = held_;  // start: whitespace or a partial "<think>" is the answer's text
  }
  held_.clear();
  return out;
}

}  // namespace kiln::server
