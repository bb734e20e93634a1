// Reasoning over streamed text: a model that thinks (Qwen3, QwQ, DeepSeek-R1 distills) writes
// "<think>reasoning</think>answer"; the splitter turns decoded text pieces into (reasoning,
// content) pieces, the chat API's reasoning_content and content. Text that could still be part
// of a tag (or whitespace at a block's edge) is held back until it is decided, so a partial
// "<thi" never reaches either side. No tokenizer or tensor work: unit-testable on its own.
#pragma once
#include <string>
#include <string_view>

namespace kiln::server {

// Whether a rendered prompt leaves a <think> block open (its last "<think>" after its last
// "</think>"): QwQ's and DeepSeek-R1's templates end the generation prompt with "<think>\n",
// so the output starts inside the reasoning and only the closing tag comes.
bool prompt_opens_reasoning(std::string_view prompt);

class ReasoningSplitter {
 public:
  struct Piece {
    std::string reasoning, content;
  };
  // in_reasoning: the prompt opened the block (prompt_opens_reasoning). Otherwise a block opens
  // only at the very start of the output (after whitespace); output that starts with anything
  // else is all content, tags included.
  explicit ReasoningSplitter(bool in_reasoning)
      : state_(in_reasoning ? State::reasoning : State::start), skip_space_(in_reasoning) {}
  // Adds decoded text; returns what is now decided. Whitespace right after either tag and right
  // before "</think>" is dropped (the templates write "<think>\n", "\n</think>\n\n").
  Piece push(std::string_view text);
  // End of output: the held-back text (an unclosed block's reasoning, or a partial tag as text).
  Piece flush();

 private:
  enum class State { start, reasoning, content };
  State state_;
  bool skip_space_;  // just after a tag (the prompt's too): leading whitespace is dropped
  std::string held_;
};

}  // namespace kiln::server
