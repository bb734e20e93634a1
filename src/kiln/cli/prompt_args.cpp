// ChatArgs: the chat-template flags of generate and chat.
#include "kiln/cli/prompt_args.h"

namespace kiln::cli {

void ChatArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--system-prompt", system_prompt, "A system message placed before the conversation");
  cmd->add_option("--chat-template", chat_template, "A Jinja chat template file that replaces the model's");
  cmd->add_option("--chat-template-config", kwargs,
                  "Extra template arguments as a JSON object, e.g. '{\"enable_thinking\": false}'");
}

}  // namespace kiln::cli
