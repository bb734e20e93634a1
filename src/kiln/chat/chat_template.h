// Chat templates as transformers applies them: the template found in a model folder
// (chat_template.jinja, chat_template.json, or tokenizer_config.json's `chat_template`, a string
// or a list of named templates), rendered with messages/tools/add_generation_prompt, the special
// tokens and extra kwargs. JSON arrives as ordered_json so dict key order survives into tojson.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::jinja {
class Template;
}

namespace kiln::chat {

class ChatTemplate {
 public:
  // The template of a model folder as transformers finds it; nullopt when the folder has none.
  // Special tokens (bos_token, eos_token, unk_token, pad_token, ...) come from
  // tokenizer_config.json (or special_tokens_map.json). Bad files throw kiln::Error.
  static std::optional<ChatTemplate> from_model_dir(const std::string& dir);
  // The special tokens of a model folder with the given template source (`--chat-template`).
  static ChatTemplate from_model_dir_with_template(const std::string& dir, std::string source);
  // One template from source text with the given bos/eos strings.
  static ChatTemplate from_string(std::string source, std::string bos_token = "", std::string eos_token = "");

  // messages/tools as OpenAI JSON (tools null -> None in the template); extra is merged into
  // the context (chat_template_kwargs). With named templates, "tool_use" is chosen when tools
  // are given and present, else "default". Errors: kiln::Error "[template] ...".
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // A chat-completions request body: `messages`, `tools`, `add_generation_prompt` (default
  // true) and `chat_template_kwargs`; other keys are ignored.
  std::string render_request(const nlohmann::ordered_json& request) const;

  // Template names ("default" for a single template) and the special-token strings.
  std::vector<std::string> names() const;
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  // Whether the template's source writes "<think>" (Qwen3, QwQ, DeepSeek-R1 distills): the
  // model reasons inside <think>...</think> before it answers (the server's reasoning_content).
  bool thinks() const { return thinks_; }

 private:
  void set_template(std::string source);  // replaces the template(s), keeping the special tokens

  struct Named {
    std::string name;
    std::shared_ptr<const jinja::Template> tmpl;
  };
  std::vector<Named> templates_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  bool thinks_ = false;
};

}  // namespace kiln::chat
