// kiln chat: an interactive REPL like mlx_lm.chat. History is kept across turns. Each turn's
// prompt is the previous turns' exact tokens (prompt and answer) plus the new text the template
// adds after them, so the engine's prefix cache finds their KV and only the new turn is
// prefilled. /reset starts over (with an empty cache), /exit quits; Ctrl-C stops an answer.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>

#include "kiln/cli/commands.h"
#include "kiln/cli/model_args.h"
#include "kiln/cli/prompt_args.h"
#include "kiln/cli/prompt_cache_args.h"
#include "kiln/cli/spec_args.h"
#include "kiln/engine/engine.h"
#include "kiln/engine/kv_sizing.h"

namespace kiln::cli {

namespace {

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

struct ChatOptions {
  ModelArgs model;
  ChatArgs chat;
  SpecArgs spec;
  PromptCacheArgs prompt_cache;
  int max_tokens = 256;
  float temp = 0.0f, top_p = 1.0f;
  std::optional<uint64_t> seed;
  bool verbose = false;
};

// With a prompt cache file, its K/V are in the new engine's prefix cache.
std::unique_ptr<engine::Engine> make_engine(const ChatOptions& o, engine::LoadedModel& m, const Drafter& drafter,
                                            const std::optional<kvstore::PromptCache>& cached) {
  engine::EngineConfig ec;
  o.spec.apply_to(ec, drafter);
  ec.scheduler.max_seqs = 1;
  ec.block_size = 8;  // small blocks: more of the previous turn is reusable
  ec.n_blocks = (m.config.max_position_embeddings + ec.block_size - 1) / ec.block_size + 1;
  // A whole conversation in the prefix cache.
  ec.prompt_cache_bytes = engine::kv_bytes_per_block(*m.model, ec.block_size) * ec.n_blocks;
  o.model.apply_to(ec);  // --kv-cache-bytes replaces the count above; the GPU budget caps it
  ec.model_key = m.cache_key();
  if (cached) reserve_prompt_cache(*cached, m, ec.block_size, ec);
  auto eng = std::make_unique<engine::Engine>(*m.model, ec);
  if (cached) import_prompt_cache(*cached, o.prompt_cache.file, *eng);
  return eng;
}

void run_chat(const ChatOptions& o) {
  auto m = o.model.load();
  chat::Renderer render = o.chat.load(m->path, m->tokenizer.get());
  // Outlives every engine below (each points at it); a /reset engine reserves its KV afresh.
  const Drafter drafter = o.spec.load(*m, o.model.load_options(), engine::SchedulerConfig{}.max_batch_tokens);
  // A conversation that continues a cached prompt: its tokens come first in every turn.
  const std::optional<kvstore::PromptCache> cached = o.prompt_cache.load(*m);
  auto eng = make_engine(o, *m, drafter, cached);
  OrderedJson messages;
  std::vector<int32_t> history;  // tokens the engine has seen: every prompt and answer so far (no EOS)
  std::string history_text;      // the rendered text those tokens stand for
  auto reset = [&] {
    history.clear();
    history_text.clear();
    messages = cached ? OrderedJson::array() : o.chat.start();  // (a cached prompt holds its own start)
  };
  reset();

  struct sigaction sa {};
  sa.sa_handler = on_sigint;  // no SA_RESTART: a read at the prompt returns and we ask again
  sigaction(SIGINT, &sa, nullptr);

  std::printf("[kiln chat: %s. Type /reset to start over, /exit to quit; Ctrl-C stops an answer.]\n", m->path.c_str());
  for (;;) {
    std::printf(">> ");
    std::fflush(stdout);
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted) {  // Ctrl-C at the prompt: a fresh prompt
        std::cin.clear();
        std::printf("\n");
        continue;
      }
      std::printf("\n");
      return;  // end of input
    }
    if (line == "/exit" || line == "/quit") return;
    if (line == "/reset") {
      reset();
      eng = make_engine(o, *m, drafter, cached);  // a fresh KV cache: nothing of the old conversation is reused
      std::printf("[conversation reset]\n");
      continue;
    }
    if (line.empty()) continue;

    messages.push_back({{"role", "user"}, {"content", line}});
    // Without a template each message is its content and a newline (not joined by newlines as
    // the server's fallback), so an answer continues the text that asked for it.
    chat::Prompt text = render.render(messages, OrderedJson::object(), chat::Fallback::line_per_message);
    if (cached) text = {text_after_cache(render, text.text), false};
    std::vector<int32_t> ids;
    if (!history.empty() && text.text.compare(0, history_text.size(), history_text) == 0) {
      ids = history;  // an exact extension: the prefix cache holds these tokens' KV
      auto rest = m->tokenizer->encode(std::string_view(text.text).substr(history_text.size()), false);
      ids.insert(ids.end(), rest.begin(), rest.end());
    } else {
      if (cached) ids = cached->tokens;
      const std::vector<int32_t> rest = m->tokenizer->encode(text.text, text.add_special_tokens);
      ids.insert(ids.end(), rest.begin(), rest.end());
    }
    engine::Request r;
    r.prompt = ids;
    r.max_tokens = o.max_tokens;
    r.stop_ids = m->eos_ids();
    r.sampling.temperature = o.temp;
    r.sampling.top_p = o.top_p;
    r.sampling.seed = o.seed;
    tokenizer::StreamDecoder detok(*m->tokenizer, true);
    std::string reply;
    int n_cached = 0, n_generated = 0;
    bool done = false;
    history = ids;
    r.on_event = [&](const engine::TokenEvent& e) {
      if (n_generated == 0) n_cached = e.n_cached;
      if (e.token >= 0) ++n_generated;
      if (e.token >= 0 && e.reason != engine::FinishReason::stop) history.push_back(e.token);
      if (e.token >= 0 && e.reason != engine::FinishReason::stop) {
        std::string text = detok.push(e.token);
        reply += text;
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      }
      done = e.finished;
    };
    g_interrupted = false;
    const engine::EngineStats before = eng->stats();
    int64_t id = eng->add(std::move(r));
    while (!done && eng->has_work()) {
      if (g_interrupted) {
        eng->cancel(id);
        std::printf(" [stopped]");
        break;
      }
      eng->step();
    }
    std::string rest = detok.flush();
    reply += rest;
    std::printf("%s\n", rest.c_str());
    messages.push_back({{"role", "assistant"}, {"content", reply}});
    history_text = text.text + reply;
    if (o.verbose)
      std::printf("[prompt: %zu tokens, reused %d, prefilled %zu; generated %d]\n", ids.size(), n_cached,
                  ids.size() - n_cached, n_generated);
    if (o.verbose && drafter.source) {  // this turn's share of the engine's totals
      const engine::EngineStats& st = eng->stats();
      std::printf("[%s]\n", spec_summary(st.draft_tokens - before.draft_tokens, st.accepted_tokens - before.accepted_tokens,
                                         st.verifies - before.verifies).c_str());
    }
  }
}

}  // namespace

void add_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  CLI::App* cmd = app.add_subcommand("chat", "Chat with a model in the terminal (history kept; /reset, /exit)");
  o->model.add_to(cmd);
  o->chat.add_to(cmd);
  cmd->add_option("-m,--max-tokens", o->max_tokens, "Maximum tokens per answer")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--temp", o->temp, "Sampling temperature (0 = greedy)")->check(CLI::Range(0.0f, 100.0f))->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed");
  o->spec.add_to(cmd, 2);  // as kiln generate (mlx_lm.generate's default)
  o->prompt_cache.add_to(cmd);
  o->model.add_max_kv_size_to(cmd);
  cmd->add_flag("--verbose", o->verbose,
                "After each answer, print prompt tokens reused from the cache vs prefilled and, when drafting, the "
                "answer's drafts accepted");
  cmd->callback([o] { run_chat(*o); });
}

}  // namespace kiln::cli
