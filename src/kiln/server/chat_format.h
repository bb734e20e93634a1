// Chat messages -> prompt text for /v1/chat/completions and /apply-template: the model's chat
// template (tokenizer_config.json's chat_template, or --chat-template), or for a model without
// one the fallback: the message contents joined by newlines, encoded like a plain prompt (BOS
// first) so it equals `kiln generate --ignore-chat-template` on the same text.
#pragma once
#include "kiln/server/api.h"

namespace kiln::server {

// template_override: a template given on the command line ("" = the tokenizer's);
// default_kwargs: --chat-template-args, merged under each request's chat_template_kwargs.
ChatRenderer make_chat_renderer(const tokenizer::Tokenizer& tok, const std::string& template_override,
                                const Json& default_kwargs);
// The fallback alone.
std::string join_message_contents(const Json& messages);

}  // namespace kiln::server
