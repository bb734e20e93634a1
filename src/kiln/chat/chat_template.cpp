// Finding and applying a model's chat template the way transformers does (see chat_template.h):
// chat_template.jinja clobbers the config's template; additional_chat_templates/*.jinja add
// named ones; the context is messages, tools, documents (None), add_generation_prompt, the
// special tokens, then the extra kwargs.
#include "kiln/chat/chat_template.h"

#include <algorithm>
#include <filesystem>

#include "kiln/base/json.h"
#include "kiln/base/mapped_file.h"
#include "kiln/jinja/renderer.h"
#include "kiln/jinja/value.h"

namespace kiln::chat {
namespace fs = std::filesystem;
using OJson = OrderedJson;

namespace {

const char* kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                   "pad_token", "cls_token", "mask_token"};

std::string read_text(const fs::path& path) { return read_file(path.string(), "template"); }

OJson read_json(const fs::path& path) { return parse_ordered_json(read_text(path), path.string(), "template"); }

// A special token in a config: a string, or an AddedToken dict {"content": ...}.
std::optional<std::string> token_string(const OJson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

std::shared_ptr<const jinja::Template> compile(const std::string& source, const std::string& where) {
  try {
    return std::make_shared<const jinja::Template>(source);
  } catch (const Error& e) {
    fail("template", "{}: {}", where, std::string(e.what()).substr(std::string("[template] ").size()));
  }
}

// A template that writes or strips "<think>" blocks belongs to a model that reasons before it answers.
bool mentions_think(const std::string& source) { return source.find("<think>") != std::string::npos; }

OJson read_config(const fs::path& root) {
  fs::path config_path = root / "tokenizer_config.json";
  OJson config = fs::exists(config_path) ? read_json(config_path) : OJson::object();
  if (!config.is_object()) fail("template", "{}: expected a JSON object", config_path.string());
  return config;
}

// Special tokens: tokenizer_config.json first, special_tokens_map.json fills the gaps.
OJson read_special_tokens(const fs::path& root, const OJson& config) {
  OJson tokens = OJson::object();
  fs::path map_path = root / "special_tokens_map.json";
  OJson token_map = fs::exists(map_path) ? read_json(map_path) : OJson::object();
  for (const char* key : kSpecialTokenKeys) {
    std::optional<std::string> tok;
    if (config.contains(key)) tok = token_string(config[key]);
    if (!tok && token_map.is_object() && token_map.contains(key)) tok = token_string(token_map[key]);
    if (tok) tokens[key] = *tok;
  }
  return tokens;
}

// The render context, in transformers' order: messages, tools, documents, add_generation_prompt,
// the special tokens, then the extra kwargs (which may not replace the first four).
jinja::DictData build_context(const OJson& messages, const OJson& tools, bool add_generation_prompt,
                              const OJson& special_tokens, const OJson& extra) {
  using jinja::Value;
  jinja::DictData ctx;
  try {
    ctx.set(Value::string("messages"), jinja::from_json(messages));
    ctx.set(Value::string("tools"), jinja::from_json(tools));
    ctx.set(Value::string("documents"), Value::none());
    ctx.set(Value::string("add_generation_prompt"), Value::boolean(add_generation_prompt));
    for (auto it = special_tokens.begin(); it != special_tokens.end(); ++it)
      ctx.set(Value::string(it.key()), jinja::from_json(it.value()));
    if (extra.is_object()) {
      for (auto it = extra.begin(); it != extra.end(); ++it) {
        const std::string& k = it.key();
        if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt") continue;
        ctx.set(Value::string(k), jinja::from_json(it.value()));
      }
    }
  } catch (const jinja::TemplateError& e) {  // JSON the interpreter cannot hold (nested too deeply)
    fail("template", "{}", e.what());
  }
  return ctx;
}

}  // namespace

ChatTemplate ChatTemplate::from_model_dir_with_template(const std::string& dir, std::string source) {
  ChatTemplate ct;
  ct.special_tokens_ = read_special_tokens(dir, read_config(dir));
  ct.set_template(std::move(source));
  return ct;
}

std::optional<ChatTemplate> ChatTemplate::from_model_dir(const std::string& dir) {
  fs::path root(dir);
  ChatTemplate ct;
  fs::path config_path = root / "tokenizer_config.json";
  OJson config = read_config(root);
  ct.special_tokens_ = read_special_tokens(root, config);

  std::string where = config_path.string();
  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const OJson& t = config["chat_template"];
    if (t.is_string()) {
      ct.templates_.push_back({"default", compile(t.get<std::string>(), where)});
      ct.thinks_ = mentions_think(t.get<std::string>());
    } else if (t.is_array()) {
      for (const auto& entry : t) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string())
          fail("template", "{}: chat_template list entries need string \"name\" and \"template\"", where);
        std::string name = entry["name"].get<std::string>();
        ct.templates_.push_back({name, compile(entry["template"].get<std::string>(), where + " (" + name + ")")});
        ct.thinks_ = ct.thinks_ || mentions_think(entry["template"].get<std::string>());
      }
    } else {
      fail("template", "{}: chat_template must be a string or a list of {{name, template}}", where);
    }
  }
  fs::path json_path = root / "chat_template.json";
  if (fs::exists(json_path)) {
    OJson j = read_json(json_path);
    if (!j.is_object() || !j.contains("chat_template") || !j["chat_template"].is_string())
      fail("template", "{}: expected {{\"chat_template\": \"...\"}}", json_path.string());
    ct.templates_ = {{"default", compile(j["chat_template"].get<std::string>(), json_path.string())}};
    ct.thinks_ = mentions_think(j["chat_template"].get<std::string>());
  }
  fs::path jinja_path = root / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    std::string source = read_text(jinja_path);
    ct.templates_ = {{"default", compile(source, jinja_path.string())}};
    ct.thinks_ = mentions_think(source);
  }
  fs::path extra_dir = root / "additional_chat_templates";
  if (fs::is_directory(extra_dir)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(extra_dir))
      if (e.path().extension() == ".jinja") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::string source = read_text(f);
      ct.templates_.push_back({f.stem().string(), compile(source, f.string())});
      ct.thinks_ = ct.thinks_ || mentions_think(source);
    }
  }
  if (ct.templates_.empty()) return std::nullopt;
  return ct;
}

ChatTemplate ChatTemplate::from_string(std::string source, std::string bos_token, std::string eos_token) {
  ChatTemplate ct;
  ct.special_tokens_["bos_token"] = std::move(bos_token);
  ct.special_tokens_["eos_token"] = std::move(eos_token);
  ct.set_template(std::move(source));
  return ct;
}

void ChatTemplate::set_template(std::string source) {
  templates_ = {{"default", compile(source, "chat template")}};
  thinks_ = mentions_think(source);
}

std::vector<std::string> ChatTemplate::names() const {
  std::vector<std::string> out;
  for (const auto& t : templates_) out.push_back(t.name);
  return out;
}

std::string ChatTemplate::render(const OJson& messages, const OJson& tools, bool add_generation_prompt,
                                 const OJson& extra) const {
  const jinja::Template* chosen = nullptr;
  if (templates_.size() == 1) {
    chosen = templates_[0].tmpl.get();
  } else {
    auto find = [&](const char* name) -> const jinja::Template* {
      for (const auto& t : templates_)
        if (t.name == name) return t.tmpl.get();
      return nullptr;
    };
    if (!tools.is_null()) chosen = find("tool_use");
    if (!chosen) chosen = find("default");
    if (!chosen) fail("template", "this model has several chat templates and none is named \"default\"");
  }
  if (!extra.is_null() && !extra.is_object()) fail("template", "chat_template_kwargs must be a JSON object");

  return chosen->render(build_context(messages, tools, add_generation_prompt, special_tokens_, extra));
}

std::string ChatTemplate::render_request(const OJson& request) const {
  if (!request.is_object()) fail("template", "the request must be a JSON object");
  if (!request.contains("messages") || !request["messages"].is_array())
    fail("template", "the request needs a \"messages\" array");
  OJson tools = request.contains("tools") ? request["tools"] : OJson();
  bool add_generation_prompt = true;
  if (request.contains("add_generation_prompt") && !request["add_generation_prompt"].is_null()) {
    if (!request["add_generation_prompt"].is_boolean()) fail("template", "\"add_generation_prompt\" must be a boolean");
    add_generation_prompt = request["add_generation_prompt"].get<bool>();
  }
  OJson extra = request.contains("chat_template_kwargs") ? request["chat_template_kwargs"] : OJson::object();
  return render(request["messages"], tools, add_generation_prompt, extra.is_null() ? OJson::object() : extra);
}

}  // namespace kiln::chat
