// make_chat_renderer: the template (errors in it become 400s naming the template) or the fallback.
#include "kiln/server/chat_format.h"

#include <memory>

namespace kiln::server {

std::string join_message_contents(const Json& messages) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i) out += "\n";
    out += messages[i].value("content", "");
  }
  return out;
}

ChatRenderer make_chat_renderer(std::optional<tokenizer::ChatTemplate> tmpl, const Json& default_kwargs) {
  if (!tmpl)
    return [](const Json& messages, const Json&) { return RenderedChat{join_message_contents(messages), true}; };
  auto t = std::make_shared<const tokenizer::ChatTemplate>(std::move(*tmpl));
  return [t, default_kwargs](const Json& messages, const Json& kwargs) {
    using OJson = nlohmann::ordered_json;
    OJson extra = OJson::parse(default_kwargs.dump());
    for (auto& [k, v] : kwargs.items()) extra[k] = OJson::parse(v.dump());
    bool add_generation_prompt = true;
    if (extra.contains("add_generation_prompt")) {
      if (!extra["add_generation_prompt"].is_boolean())
        throw ApiError(400, "'add_generation_prompt' must be true or false", "add_generation_prompt", "invalid_value");
      add_generation_prompt = extra["add_generation_prompt"].get<bool>();
      extra.erase("add_generation_prompt");
    }
    try {
      std::string text = t->render(OJson::parse(messages.dump()), nullptr, add_generation_prompt, extra);
      return RenderedChat{std::move(text), false};  // the template writes its own special tokens
    } catch (const ApiError&) {
      throw;
    } catch (const std::exception& e) {
      throw ApiError(400, std::string("the chat template failed on these messages: ") + e.what(), "messages",
                     "template_error");
    }
  };
}

}  // namespace kiln::server
