// The renderer (template or fallback, default kwargs under each call's) and the override policy:
// which template a command runs on, read once from the flags and the model folder.
#include "kiln/chat/prompt.h"

#include <filesystem>

#include "kiln/base/mapped_file.h"

namespace kiln::chat {

Renderer::Renderer(std::optional<ChatTemplate> tmpl, OrderedJson default_kwargs)
    : tmpl_(std::move(tmpl)), default_kwargs_(std::move(default_kwargs)) {}

Prompt Renderer::render(const OrderedJson& messages, const OrderedJson& kwargs, Fallback fallback) const {
  if (!tmpl_) {
    std::string text;
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i > 0 && fallback == Fallback::join_lines) text += "\n";
      text += messages[i].value("content", "");
      if (fallback == Fallback::line_per_message) text += "\n";
    }
    return {std::move(text), true};
  }
  OrderedJson extra = default_kwargs_;
  extra.update(kwargs);  // the call's kwargs win
  bool add_generation_prompt = true;
  if (auto it = extra.find("add_generation_prompt"); it != extra.end()) {
    if (!it->is_boolean()) fail("template", "\"add_generation_prompt\" must be a boolean");
    add_generation_prompt = it->get<bool>();
    extra.erase(it);
  }
  bool continue_final = false;
  if (auto it = extra.find("continue_final_message"); it != extra.end()) {
    if (!it->is_boolean()) fail("template", "\"continue_final_message\" must be a boolean");
    continue_final = it->get<bool>();
    extra.erase(it);
  }
  std::string text = tmpl_->render(messages, nullptr, add_generation_prompt, extra);
  if (continue_final) {
    // As transformers: the text ends right after the last message's (stripped) content, so that
    // whatever comes next continues that message.
    if (add_generation_prompt) fail("template", "continue_final_message and add_generation_prompt exclude each other");
    if (messages.empty()) fail("template", "continue_final_message needs a message to continue");
    std::string last = messages.back().value("content", "");
    const size_t b = last.find_first_not_of(" \t\n\r"), e = last.find_last_not_of(" \t\n\r");
    last = b == std::string::npos ? std::string() : last.substr(b, e - b + 1);
    const size_t at = text.rfind(last);
    if (at == std::string::npos)
      fail("template", "continue_final_message: the template does not write the last message's content verbatim");
    text.resize(at + last.size());
  }
  return {std::move(text), false};
}

Renderer TemplatePolicy::load(const std::string& model_path, const tokenizer::Tokenizer* tok) const {
  OrderedJson extra = OrderedJson::object();
  if (!kwargs.empty()) {
    extra = parse_ordered_json(kwargs, kwargs_flag, "template");
    if (!extra.is_object())
      fail("template", "{} must be a JSON object, e.g. '{{\"enable_thinking\": false}}'", kwargs_flag);
  }
  if (ignore_chat_template) return Renderer(std::nullopt, std::move(extra));
  std::error_code ec;
  bool is_dir = std::filesystem::is_directory(model_path, ec);
  if (chat_template.empty())
    return Renderer(is_dir ? ChatTemplate::from_model_dir(model_path) : std::nullopt, std::move(extra));
  std::string source = template_is_text ? chat_template : read_file(chat_template, "template");
  if (is_dir) return Renderer(ChatTemplate::from_model_dir_with_template(model_path, std::move(source)), std::move(extra));
  return Renderer(ChatTemplate::from_string(std::move(source), tok ? tok->bos_token() : "", tok ? tok->eos_token() : ""),
                  std::move(extra));
}

OrderedJson TemplatePolicy::start() const {
  OrderedJson messages = OrderedJson::array();
  if (!system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", system_prompt}});
  return messages;
}

}  // namespace kiln::chat
