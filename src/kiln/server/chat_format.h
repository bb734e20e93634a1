// Chat messages -> prompt text for /v1/chat/completions and /apply-template: the model's chat
// template (tokenizer::ChatTemplate: the folder's template, or --chat-template), or for a model
// without one the fallback: the message contents joined by newlines, encoded like a plain prompt
// (BOS first) so it equals `kiln generate --ignore-chat-template` on the same text.
#pragma once
#include <optional>

#include "kiln/server/api.h"
#include "kiln/tokenizer/chat_template.h"

namespace kiln::server {

// default_kwargs: --chat-template-args, under each request's chat_template_kwargs (which win).
// A request's kwargs may set add_generation_prompt (default true).
ChatRenderer make_chat_renderer(std::optional<tokenizer::ChatTemplate> tmpl, const Json& default_kwargs);
// The fallback alone.
std::string join_message_contents(const Json& messages);

}  // namespace kiln::server
