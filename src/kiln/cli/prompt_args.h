// Chat-template flags shared by generate and chat (--system-prompt, --chat-template,
// --chat-template-config) and turning messages into prompt tokens the way the server does
// (server::make_chat_renderer: the template, or contents joined by newlines without one).
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/engine/loader.h"
#include "kiln/server/api.h"

namespace kiln::cli {

struct ChatArgs {
  std::string system_prompt;
  std::string chat_template_file;    // --chat-template: overrides the model's template
  std::string chat_template_config;  // --chat-template-config: JSON object of extra kwargs
  void add_to(CLI::App* cmd);
  // Installs --chat-template into m (after loading).
  void apply_to(engine::LoadedModel& m) const;
  // messages (OpenAI shape) -> prompt text (with add_generation_prompt) and whether encoding it
  // adds special tokens (the fallback for models without a template does; templates write their own).
  server::RenderedChat render(const engine::LoadedModel& m, const Json& messages) const;
  // render() then tokenize.
  std::vector<int32_t> encode(const engine::LoadedModel& m, const Json& messages) const;
};

}  // namespace kiln::cli
