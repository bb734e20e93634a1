// Chat-template flags shared by generate and chat (--system-prompt, --chat-template FILE,
// --chat-template-config JSON): the flags of chat::TemplatePolicy, the one policy that picks the
// template (and renders through it as the server does).
#pragma once
#include <CLI/CLI.hpp>

#include "kiln/chat/prompt.h"

namespace kiln::cli {

struct ChatArgs : chat::TemplatePolicy {
  void add_to(CLI::App* cmd) {
    cmd->add_option("--system-prompt", system_prompt, "A system message placed before the conversation");
    cmd->add_option("--chat-template", chat_template, "A Jinja chat template file that replaces the model's");
    cmd->add_option("--chat-template-config", kwargs,
                    "Extra template arguments as a JSON object, e.g. '{\"enable_thinking\": false}'");
  }
};

}  // namespace kiln::cli
