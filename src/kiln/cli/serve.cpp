// kiln serve: the OpenAI-compatible HTTP server, with mlx_lm.server's flag names where they
// apply. Loads the model, starts the engine thread and the HTTP server, and runs until
// SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>
#include <filesystem>


#include "kiln/base/json.h"
#include "kiln/base/log.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/embedded.h"
#include "kiln/cli/model_args.h"
#include "kiln/cli/spec_args.h"
#include "kiln/engine/engine_thread.h"
#include "kiln/server/server.h"

namespace kiln::cli {

namespace {

struct ServeArgs {
  ModelArgs model;
  server::ServerConfig http;
  chat::TemplatePolicy chat;
  SpecArgs spec;
  float temp = 0.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = 0, max_tokens = 512;
  int batch = 8, max_batch_tokens = 2048;
  size_t prompt_cache_bytes = 2ull << 30;
  kvstore::SsdConfig ssd;
};

server::Server* g_server = nullptr;

void on_signal(int) {
  if (g_server) g_server->stop();
}

void run_serve(ServeArgs& a) {
  auto m = a.model.load();
  // The chat template, loaded once: --chat-template (template text, as mlx_lm.server takes it),
  // else the folder's; the embedded model has none.
  chat::Renderer render = a.chat.load(m->path, m->tokenizer.get());
  if (!render.chat_template()) log::info("{} has no chat template: chat joins message contents with newlines", m->path);

  engine::EngineConfig ec;
  ec.scheduler.max_seqs = a.batch;
  ec.scheduler.max_batch_tokens = a.max_batch_tokens;
  a.model.apply_to(ec);  // --kv-cache-bytes, --gpu-memory-utilization
  ec.prompt_cache_bytes = a.prompt_cache_bytes;
  ec.model_key = m->cache_key();  // the SSD tier's blocks match this model and tokenizer only
  ec.ssd = a.ssd;
  ec.model_name = m->path;
  // Loaded (and its tokenizer checked) before the server binds; declared before the engine, which points at it.
  const Drafter drafter = a.spec.load(*m, a.model.load_options(), a.max_batch_tokens);
  a.spec.apply_to(ec, drafter);
  engine::Engine eng(*m->model, ec);
  engine::EngineThread et(eng);

  server::ApiLimits lim;
  std::string name = m->path == kEmbeddedName ? "stories260K" : std::filesystem::path(m->path).filename().string();
  if (name.empty()) name = m->path;
  lim.model_ids = {name, m->path};
  if (!a.model.model.empty()) lim.model_ids.push_back(a.model.model);
  lim.context_length = eng.context_length();
  lim.vocab_size = m->config.vocab_size;
  lim.default_max_tokens = a.max_tokens;
  lim.default_sampling.temperature = a.temp;
  lim.default_sampling.top_p = a.top_p;
  lim.default_sampling.top_k = a.top_k;
  lim.default_sampling.min_p = a.min_p;
  lim.max_n = std::max(1, std::min(16, 2 * a.batch));
  a.http.stop_ids = m->eos_ids();

  server::Server srv(a.http, *m->tokenizer, et, lim, render);
  srv.bind();
  g_server = &srv;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  std::string spec = drafter.source ? fmt::format(", drafts: {} up to {}", drafter.source->name(), a.spec.num_draft_tokens) : "";
  std::fprintf(stderr, "kiln serve: %s on http://%s:%d (batch %d, %d KV blocks of %d tokens%s)\n", name.c_str(),
               a.http.host.c_str(), srv.port(), a.batch, eng.blocks().n_blocks(), eng.blocks().block_size(), spec.c_str());
  std::fflush(stderr);
  srv.listen();
  g_server = nullptr;
}

}  // namespace

void add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  a->model.add_to(cmd);
  auto& h = a->http;
  cmd->add_option("--host", h.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", h.port, "Port to listen on (0: any free port, printed at startup)")
      ->check(CLI::Range(0, 65535))->capture_default_str();
  a->chat.template_is_text = true;  // the template text, as mlx_lm.server takes it
  a->chat.kwargs_flag = "--chat-template-args";
  cmd->add_option("--chat-template", a->chat.chat_template, "A chat template (Jinja) to use instead of the tokenizer's");
  cmd->add_option("--chat-template-args", a->chat.kwargs,
                  "JSON object of extra chat template variables (e.g. '{\"enable_thinking\": false}')");
  cmd->add_option("--temp", a->temp, "Default sampling temperature")->check(CLI::Range(0.0f, 100.0f))->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "Default nucleus sampling mass")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Default top-k (0 = off)")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--min-p", a->min_p, "Default min-p")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  cmd->add_option("--max-tokens", a->max_tokens, "Default max tokens per completion")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--batch", a->batch, "Sequences decoded together (continuous batching)")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "Token budget per engine step (prefill chunks + decodes)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--prompt-cache-bytes", a->prompt_cache_bytes, "Prefix cache size in bytes (0 = off)")->capture_default_str();
  cmd->add_option("--ssd-cache-dir", a->ssd.dir,
                  "Keep the prefix cache's KV blocks on disk in this folder too (one subfolder per model and KV "
                  "layout): a later server, after a restart, reads them back instead of recomputing the prompt");
  cmd->add_option("--ssd-cache-bytes", a->ssd.max_bytes,
                  "Size budget of --ssd-cache-dir's model folder; least recently used blocks are deleted past it")
      ->capture_default_str();
  a->spec.add_to(cmd, 3);  // mlx_lm.server's default; a request's num_draft_tokens may lower it
  cmd->add_option("--api-key", h.api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--cors-origin", h.cors_origin, "Send CORS headers allowing this origin (e.g. '*')");
  cmd->add_option("--max-request-bytes", h.max_body_bytes, "Largest request body accepted (413 above)")->capture_default_str();
  cmd->add_option("--timeout", h.request_timeout_s, "Seconds after which a request is cancelled")
      ->check(CLI::Range(0.001, 1e7))->capture_default_str();
  cmd->add_option("--http-threads", h.http_threads, "HTTP worker threads (each open stream holds one)")
      ->check(CLI::Range(4, 4096))->capture_default_str();
  cmd->add_option("--max-queue", h.max_queue, "Requests waiting or running at most (503 above)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace kiln::cli
