// kiln apply-template: renders a chat-completions request body through the model's chat template
// and prints the prompt to stdout byte for byte (nothing else), as transformers'
// apply_chat_template(tokenize=False) would. Reads only tokenizer_config.json / template files.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>

#include "kiln/base/mapped_file.h"
#include "kiln/chat/prompt.h"
#include "kiln/cli/commands.h"
#include "kiln/io/model_path.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

struct ApplyTemplateArgs {
  std::string model;
  std::string request;
  std::string chat_template;
};

std::string read_input(const std::string& path) {
  if (path == "-") return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  return read_file(path, "apply-template");
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
  OrderedJson request = parse_ordered_json(read_input(a.request), a.request, "apply-template");
  std::string dir = a.model.empty() ? "" : model_dir(a.model);
  chat::TemplatePolicy policy;
  policy.chat_template = a.chat_template.empty() ? "" : read_input(a.chat_template);
  policy.template_is_text = true;
  chat::Renderer render = policy.load(dir, nullptr);
  const chat::ChatTemplate* ct = render.chat_template();
  if (!ct) {
    fail("template", "{} has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja); "
         "pass --chat-template FILE", dir);
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
