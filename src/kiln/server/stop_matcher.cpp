// StopMatcher: search the held text for the earliest complete stop string; otherwise keep back the
// longest suffix that is a prefix of some stop string and emit the rest.
#include "kiln/server/stop_matcher.h"

#include <algorithm>

namespace kiln::server {

std::string StopMatcher::push(const std::string& text) {
  if (stopped_) return "";
  held_ += text;
  if (stops_.empty()) {
    std::string out;
    out.swap(held_);
    return out;
  }
  size_t first = std::string::npos;
  for (auto& s : stops_) {
    size_t p = held_.find(s);
    if (p != std::string::npos && (first == std::string::npos || p < first)) {
      first = p;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Longest suffix of held_ that is a proper prefix of a stop string: it must wait.
  size_t keep = 0;
  for (auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  return out;
}

}  // namespace kiln::server
