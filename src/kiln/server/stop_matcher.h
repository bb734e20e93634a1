// Stop strings over streamed text: text that could still be the start of a stop string is held
// back until it is decided, so a stop string is never emitted, even when it spans tokens.
// No tensor or tokenizer work: unit-testable on its own.
#pragma once
#include <string>
#include <vector>

namespace kiln::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds decoded text; returns the text that is now safe to emit. Once a stop string matches,
  // returns the text before it and stopped() turns true; later pushes return "".
  std::string push(const std::string& text);
  // End of generation without a stop: the held-back text.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace kiln::server
