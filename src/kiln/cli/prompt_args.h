// Chat-template flags shared by generate and chat (--system-prompt, --chat-template FILE,
// --chat-template-config JSON): the flags of chat::TemplatePolicy, the one policy that picks the
// template (and renders through it as the server does).
#pragma once
#include <CLI/CLI.hpp>

#include "kiln/chat/prompt.h"

namespace kiln::cli {

struct ChatArgs : chat::TemplatePolicy {
  void add_to(CLI::App* cmd);
};

}  // namespace kiln::cli
