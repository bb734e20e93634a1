// Chat messages -> prompt text, the one path for `kiln generate`, `chat`, `serve` and
// `apply-template`: TemplatePolicy (the user's flags over the model's template: --chat-template,
// its kwargs, --ignore-chat-template, --system-prompt) picks the template once; a Renderer renders
// through it, or through the fallback for models without one. Messages are ordered JSON, so each
// message's key order reaches the template as the client sent it.
#pragma once
#include <optional>
#include <string>

#include "kiln/base/json.h"
#include "kiln/chat/chat_template.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::chat {

// A chat rendered to prompt text. A chat template writes its own special tokens; the fallback's
// text is encoded like a plain prompt (with BOS).
struct Prompt {
  std::string text;
  bool add_special_tokens = false;
};

// The fallback for a model without a chat template: its messages' contents as plain text.
enum class Fallback {
  join_lines,        // contents joined by "\n" (serve, generate: equals the raw prompt)
  line_per_message,  // each content followed by "\n" (kiln chat: an answer continues the text)
};

class Renderer {
 public:
  // default_kwargs: extra template variables (--chat-template-config / --chat-template-args),
  // under each render's kwargs (which win).
  explicit Renderer(std::optional<ChatTemplate> tmpl = std::nullopt,
                    OrderedJson default_kwargs = OrderedJson::object());

  // The template, or nullptr when the fallback renders.
  const ChatTemplate* chat_template() const { return tmpl_ ? &*tmpl_ : nullptr; }

  // messages (OpenAI shape, content strings) -> prompt. kwargs (a JSON object) may set
  // add_generation_prompt (a boolean, default true) and continue_final_message (transformers':
  // the text stops after the last message's content). Errors: kiln::Error "[template] ...".
  // The fallback ignores kwargs.
  Prompt render(const OrderedJson& messages, const OrderedJson& kwargs = OrderedJson::object(),
                Fallback fallback = Fallback::join_lines) const;

 private:
  std::optional<ChatTemplate> tmpl_;
  OrderedJson default_kwargs_;
};

// The user's say over the model's chat template; the flags live in cli/, the rules here.
struct TemplatePolicy {
  std::string chat_template;        // --chat-template: a template file, or the text itself when template_is_text
  bool template_is_text = false;    // serve takes the template text, as mlx_lm.server does
  std::string kwargs;               // a JSON object of extra template variables ("" = none)
  std::string kwargs_flag = "--chat-template-config";  // its flag, named in errors (serve: --chat-template-args)
  bool ignore_chat_template = false;  // --ignore-chat-template: no template, the fallback renders
  std::string system_prompt;        // --system-prompt: a system message first

  // The renderer for the model at `model_path`: --chat-template with the folder's special tokens,
  // else the folder's own template as transformers finds it; for a path that is no folder (the
  // embedded model, or none) only --chat-template, with tok's bos/eos (or "" without tok).
  // Loads the template once. Bad flags or files throw kiln::Error.
  Renderer load(const std::string& model_path, const tokenizer::Tokenizer* tok) const;
  // A conversation's first messages: the system prompt, if any.
  OrderedJson start() const;
};

}  // namespace kiln::chat
