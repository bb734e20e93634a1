// kiln cache-prompt: prefills a prompt and saves its K/V to a file (mlx_lm.cache_prompt's flags),
// which `kiln generate/chat --prompt-cache-file` continue from. The chat template renders the
// prompt as a user turn with add_generation_prompt=false and continue_final_message=true, so the
// cache ends inside that turn and a later prompt continues it.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>

#include "kiln/cli/commands.h"
#include "kiln/cli/model_args.h"
#include "kiln/cli/prompt_args.h"
#include "kiln/engine/engine.h"
#include "kiln/engine/kv_sizing.h"
#include "kiln/kvstore/prompt_file.h"

namespace kiln::cli {

namespace {

struct CachePromptArgs {
  ModelArgs model;
  std::string prompt, file;
  ChatArgs chat;
  int quantized_kv_start = 0;
};

void run_cache_prompt(const CachePromptArgs& a) {
  std::string prompt = a.prompt;
  if (prompt == "-") prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::unique_ptr<engine::LoadedModel> m = a.model.load();
  chat::Renderer render = a.chat.load(m->path, m->tokenizer.get());
  OrderedJson messages = render.chat_template() ? a.chat.start() : OrderedJson::array();
  messages.push_back({{"role", "user"}, {"content", prompt}});
  const chat::Prompt text =
      render.render(messages, OrderedJson{{"add_generation_prompt", false}, {"continue_final_message", true}});
  const std::vector<int32_t> ids = m->tokenizer->encode(text.text, text.add_special_tokens);
  if (ids.empty()) fail("cache-prompt", "the prompt is empty; give --prompt TEXT (or - for stdin)");
  // mlx-lm quantizes its cache once it passes --quantized-kv-start tokens; a cache file is one or the
  // other, so here the whole cache is quantized when the prompt reaches it, else it stays float.
  if (a.model.kv_bits != 0 && static_cast<int64_t>(ids.size()) < a.quantized_kv_start) {
    std::fprintf(stderr, "The prompt has %zu tokens, fewer than --quantized-kv-start %d: the cache stays float\n",
                 ids.size(), a.quantized_kv_start);
    ModelArgs float_args = a.model;
    float_args.kv_bits = 0;
    m = float_args.load();
  }

  engine::EngineConfig ec;
  ec.scheduler.max_seqs = 1;
  ec.model_key = m->cache_key();
  ec.n_blocks = static_cast<int>(ids.size()) / ec.block_size + 2;
  // Every full block of the prompt stays in the prefix cache after the request, to be exported.
  ec.prompt_cache_bytes = engine::kv_bytes_per_block(*m->model, ec.block_size) * ec.n_blocks;
  a.model.apply_to(ec);
  engine::Engine eng(*m->model, ec);

  engine::Request r;
  r.prompt = ids;
  r.max_tokens = 0;  // prefill only
  const auto t0 = std::chrono::steady_clock::now();
  eng.add(std::move(r));
  const int total = static_cast<int>(ids.size());
  int done = 0;
  while (eng.has_work()) {
    done += eng.step();
    std::fprintf(stderr, "\rPrefilling: %d/%d tokens", std::min(done, total), total);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "\n");

  kvstore::PromptCache pc;
  pc.model = m->path;
  pc.model_fingerprint = m->fingerprint;
  pc.tokenizer_fingerprint = m->tokenizer_fingerprint;
  pc.tokens = ids;
  pc.layout = kvstore::KvLayout::of(eng.kv_cache());
  pc.n_layers = m->config.n_layers;
  pc.n_blocks = eng.export_prefix(ids, pc.data);  // (a rotating cache: the blocks before max_kv_size)
  pc.max_kv_size = a.model.max_kv_size;
  kvstore::save_prompt_cache(a.file, pc);
  std::printf("Saved %s: %d tokens (K/V of %d), %.1f MB, prefilled in %.2f s (%.1f tokens/s)\n", a.file.c_str(), total,
              pc.n_cached_tokens(), pc.data.size() / 1e6, s, total / std::max(s, 1e-9));
}

}  // namespace

void add_cache_prompt(CLI::App& app) {
  auto a = std::make_shared<CachePromptArgs>();
  CLI::App* cmd = app.add_subcommand("cache-prompt", "Prefill a prompt and save its KV cache to a file for later runs");
  a->model.add_to(cmd);
  a->model.add_max_kv_size_to(cmd);
  cmd->add_option("-p,--prompt", a->prompt, "The prompt to cache; \"-\" reads it from stdin")->required();
  cmd->add_option("--prompt-cache-file", a->file, "The file to write (safetensors)")->required();
  a->chat.add_to(cmd);
  cmd->add_option("--quantized-kv-start", a->quantized_kv_start,
                  "With --kv-bits: quantize the cache only when the prompt has at least this many tokens (the whole "
                  "cache, else none of it; mlx-lm's default is 5000)")
      ->capture_default_str();
  cmd->add_flag("--ignore-chat-template", a->chat.ignore_chat_template, "Cache the raw prompt, without the chat template");
  cmd->callback([a] { run_cache_prompt(*a); });
}

}  // namespace kiln::cli
