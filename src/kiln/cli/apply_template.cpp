// kiln apply-template: renders a chat-completions request body through the model's chat template
// and prints the prompt to stdout byte for byte (nothing else), as transformers'
// apply_chat_template(tokenize=False) would. Reads only tokenizer_config.json / template files.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "kiln/base/error.h"
#include "kiln/cli/commands.h"
#include "kiln/io/model_path.h"
#include "kiln/tokenizer/chat_template.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

struct ApplyTemplateArgs {
  std::string model;
  std::string request;
  std::string chat_template;
};

std::string read_input(const std::string& path, const char* what) {
  if (path == "-") return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("apply-template", "cannot read the {} file {}", what, path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The model folder: io's resolution (a folder with config.json, or an HF cache repo id); a local
// folder that holds only tokenizer files is accepted too, since no weights are needed here.
std::string model_dir(const std::string& arg) {
  try {
    return io::resolve_model_path(arg);
  } catch (const Error&) {
    std::error_code ec;
    fs::path p(arg);
    if (fs::is_directory(p, ec) && (fs::exists(p / "tokenizer_config.json", ec) || fs::exists(p / "chat_template.jinja", ec) ||
                                    fs::exists(p / "chat_template.json", ec)))
      return arg;
    throw;
  }
}

void run_apply_template(const ApplyTemplateArgs& a) {
  if (a.model.empty() && a.chat_template.empty())
    fail("apply-template", "give --model (a folder or HF repo id) or --chat-template FILE");
  nlohmann::ordered_json request;
  std::string text = read_input(a.request, "request");
  try {
    request = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::parse_error& e) {
    fail("apply-template", "{}: invalid JSON: {}", a.request, e.what());
  }

  std::optional<tokenizer::ChatTemplate> ct;
  if (!a.chat_template.empty()) {
    std::string source = read_input(a.chat_template, "chat template");
    ct = a.model.empty() ? tokenizer::ChatTemplate::from_string(std::move(source))
                         : tokenizer::ChatTemplate::from_model_dir_with_template(model_dir(a.model), std::move(source));
  } else {
    std::string dir = model_dir(a.model);
    ct = tokenizer::ChatTemplate::from_model_dir(dir);
    if (!ct) {
      fail("template", "{} has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja); "
           "pass --chat-template FILE", dir);
    }
  }
  std::string prompt = ct->render_request(request);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void add_apply_template(CLI::App& app) {
  auto args = std::make_shared<ApplyTemplateArgs>();
  CLI::App* cmd = app.add_subcommand("apply-template",
                                     "Print the prompt a chat-completions request renders to (the model's chat template)");
  cmd->add_option("--model", args->model, "Model folder or Hugging Face repo id in the local HF cache");
  cmd->add_option("--request", args->request,
                  "JSON request body: messages, tools, add_generation_prompt (default true), chat_template_kwargs; - for stdin")
      ->required();
  cmd->add_option("--chat-template", args->chat_template, "A Jinja template file used instead of the model's");
  cmd->callback([args] { run_apply_template(*args); });
}

}  // namespace kiln::cli
