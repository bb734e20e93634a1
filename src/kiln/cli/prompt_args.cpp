// ChatArgs: flags, template override, and rendering + tokenizing a conversation.
#include "kiln/cli/prompt_args.h"

#include "kiln/base/mapped_file.h"
#include "kiln/server/chat_format.h"

namespace kiln::cli {

void ChatArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--system-prompt", system_prompt, "A system message placed before the conversation");
  cmd->add_option("--chat-template", chat_template_file, "A Jinja chat template file that replaces the model's");
  cmd->add_option("--chat-template-config", chat_template_config,
                  "Extra template arguments as a JSON object, e.g. '{\"enable_thinking\": false}'");
}

void ChatArgs::apply_to(engine::LoadedModel& m) const {
  if (chat_template_file.empty()) return;
  std::string source = read_file(chat_template_file, "template");
  if (m.chat_template) {
    m.chat_template->set_template(std::move(source));
  } else {
    auto name = [&](const std::optional<int32_t>& id) { return id ? m.tokenizer->id_to_token(*id) : std::string(); };
    m.chat_template = tokenizer::ChatTemplate::from_string(std::move(source), name(m.tokenizer->bos_id()), name(m.tokenizer->eos_id()));
  }
}

server::RenderedChat ChatArgs::render(const engine::LoadedModel& m, const Json& messages) const {
  Json kwargs = Json::object();
  if (!chat_template_config.empty()) {
    kwargs = parse_json(chat_template_config, "--chat-template-config", "template");
    if (!kwargs.is_object()) fail("template", "--chat-template-config must be a JSON object, e.g. '{{\"enable_thinking\": false}}'");
  }
  auto render = server::make_chat_renderer(m.chat_template, kwargs);
  return render(messages, Json::object());
}

std::vector<int32_t> ChatArgs::encode(const engine::LoadedModel& m, const Json& messages) const {
  server::RenderedChat r = render(m, messages);
  return m.tokenizer->encode(r.text, r.add_special_tokens);
}

}  // namespace kiln::cli
