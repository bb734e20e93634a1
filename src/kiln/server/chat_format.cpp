// make_chat_renderer: picks the chat template or the fallback once, at startup.
#include "kiln/server/chat_format.h"

namespace kiln::server {

std::string join_message_contents(const Json& messages) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i) out += "\n";
    out += messages[i].value("content", "");
  }
  return out;
}

ChatRenderer make_chat_renderer(const tokenizer::Tokenizer& tok, const std::string& template_override,
                                const Json& default_kwargs) {
  std::string source = template_override;
  if (source.empty() && tok.config().contains("chat_template") && tok.config()["chat_template"].is_string())
    source = tok.config()["chat_template"].get<std::string>();
  if (!source.empty())
    fail("serve", "this build cannot render chat templates yet; start the server with a model without one");
  (void)default_kwargs;
  return [](const Json& messages, const Json&) { return RenderedChat{join_message_contents(messages), true}; };
}

}  // namespace kiln::server
