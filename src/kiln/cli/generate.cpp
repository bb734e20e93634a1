// kiln generate: one prompt in, streamed text out, as mlx_lm.generate (same flag names).
// Runs through the engine with a single sequence: the same path the server batches.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>

#include "kiln/base/log.h"
#include "kiln/base/mapped_file.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/model_args.h"
#include "kiln/cli/prompt_args.h"
#include "kiln/cli/prompt_cache_args.h"
#include "kiln/cli/spec_args.h"
#include "kiln/engine/engine.h"
#include "kiln/grammar/grammar_cache.h"

namespace kiln::cli {

namespace {

struct GenerateArgs {
  ModelArgs model;
  std::string prompt;
  int max_tokens = 100;
  float temp = 0.0f, top_p = 1.0f, min_p = 0.0f, repetition_penalty = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
  ChatArgs chat;
  SpecArgs spec;
  PromptCacheArgs prompt_cache;
  // Structured output (at most one): a JSON Schema file, a GBNF file, a regex.
  std::string json_schema, grammar, regex;
  bool verbose = false;
};

// The grammar the output must follow, compiled on the tokenizer's vocabulary; null without one.
// Schema keywords kiln does not enforce are warnings on stderr.
std::shared_ptr<const grammar::TokenMasker> load_grammar(const GenerateArgs& a, const tokenizer::Tokenizer& tok) {
  if (a.json_schema.empty() && a.grammar.empty() && a.regex.empty()) return nullptr;
  grammar::Source kind = grammar::Source::regex;
  std::string text = a.regex;
  grammar::SchemaOptions opt;
  opt.additional_properties = false;  // as the server's response_format (docs/server.md)
  if (!a.json_schema.empty()) kind = grammar::Source::json_schema, text = read_file(a.json_schema, "generate");
  if (!a.grammar.empty()) kind = grammar::Source::gbnf, text = read_file(a.grammar, "generate");
  grammar::GrammarCache cache(grammar::TokenTable::from_tokenizer(tok), 1);
  grammar::CompiledSource c = cache.get(kind, text, opt);
  for (const std::string& w : c.warnings) log::warn("--json-schema: {}", w);
  return c.masker;
}

void run_generate(const GenerateArgs& a) {
  std::string prompt = a.prompt;
  if (prompt == "-") prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  auto m = a.model.load();
  // As mlx_lm.generate: the chat template (when the model has one) wraps the prompt as a user turn.
  // Without one the fallback renders that turn alone: the raw prompt, with BOS.
  chat::Renderer render = a.chat.load(m->path, m->tokenizer.get());
  const std::optional<kvstore::PromptCache> cached = a.prompt_cache.load(*m);
  std::vector<int32_t> ids;
  if (cached) {  // the file's tokens, then the new prompt as their continuation
    ids = cached->tokens;
    const std::string turn = render.render(OrderedJson::array({{{"role", "user"}, {"content", prompt}}})).text;
    const std::vector<int32_t> rest = m->tokenizer->encode(text_after_cache(render, turn), false);
    ids.insert(ids.end(), rest.begin(), rest.end());
  } else {
    OrderedJson messages = render.chat_template() ? a.chat.start() : OrderedJson::array();
    messages.push_back({{"role", "user"}, {"content", prompt}});
    chat::Prompt text = render.render(messages);
    ids = m->tokenizer->encode(text.text, text.add_special_tokens);
  }
  if (ids.empty()) {  // an empty prompt with no BOS to add: start from BOS if the model has one
    auto bos = m->config.bos_id ? m->config.bos_id : m->tokenizer->bos_id();
    if (!bos) fail("generate", "the prompt is empty and the model has no BOS token; give --prompt");
    ids.push_back(*bos);
  }

  engine::EngineConfig ec;
  ec.scheduler.max_seqs = 1;
  // Declared before the engine, which points at it.
  const Drafter drafter = a.spec.load(*m, a.model.load_options(), ec.scheduler.max_batch_tokens);
  a.spec.apply_to(ec, drafter);
  // Room for the prompt, the output and, when drafting, the K/V of the drafts a step verifies past it.
  const int n_draft = drafter.source ? a.spec.num_draft_tokens : 0;
  const int n_tokens = std::min<int>(m->config.max_position_embeddings, static_cast<int>(ids.size()) + a.max_tokens + n_draft);
  ec.n_blocks = (n_tokens + ec.block_size) / ec.block_size + 1;
  a.model.apply_to(ec);  // --kv-cache-bytes replaces the count above; the GPU budget caps it
  ec.model_key = m->cache_key();
  if (cached) reserve_prompt_cache(*cached, *m, ec.block_size, ec);
  engine::Engine eng(*m->model, ec);
  if (cached) import_prompt_cache(*cached, a.prompt_cache.file, eng);

  engine::Request r;
  r.prompt = ids;
  r.max_tokens = a.max_tokens;
  r.stop_ids = m->eos_ids();
  r.sampling.temperature = a.temp;
  r.sampling.top_p = a.top_p;
  r.sampling.top_k = a.top_k;
  r.sampling.min_p = a.min_p;
  r.sampling.repetition_penalty = a.repetition_penalty;
  r.sampling.seed = a.seed;
  r.grammar = load_grammar(a, *m->tokenizer);
  tokenizer::StreamDecoder detok(*m->tokenizer, true);
  int n_generated = 0, n_cached = 0;
  auto t_first = std::chrono::steady_clock::now();
  r.on_event = [&](const engine::TokenEvent& e) {
    if (e.token < 0) return;
    if (n_generated++ == 0) {
      t_first = std::chrono::steady_clock::now();
      n_cached = e.n_cached;
    }
    if (e.reason == engine::FinishReason::stop) return;  // EOS is not printed
    std::string text = detok.push(e.token);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  if (a.verbose) std::fprintf(stdout, "==========\n");
  auto t0 = std::chrono::steady_clock::now();
  eng.add(std::move(r));
  while (eng.has_work()) eng.step();
  auto t_end = std::chrono::steady_clock::now();
  std::string rest = detok.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fprintf(stdout, "\n");
  if (a.verbose) {
    double prompt_s = std::chrono::duration<double>(t_first - t0).count();
    double gen_s = std::chrono::duration<double>(t_end - t_first).count();
    std::fprintf(stdout, "==========\n");
    // Speed over the tokens computed (those after a --prompt-cache-file's are all of them but the cached).
    const size_t computed = ids.size() - n_cached;
    if (n_cached > 0)
      std::fprintf(stdout, "Prompt: %zu tokens (%d from the cache), %zu computed, %.3f tokens-per-sec\n", ids.size(),
                   n_cached, computed, computed / std::max(prompt_s, 1e-9));
    else
      std::fprintf(stdout, "Prompt: %zu tokens, %.3f tokens-per-sec\n", ids.size(), ids.size() / std::max(prompt_s, 1e-9));
    std::fprintf(stdout, "Generation: %d tokens, %.3f tokens-per-sec\n", n_generated,
                 n_generated > 1 ? (n_generated - 1) / std::max(gen_s, 1e-9) : 0.0);
    if (drafter.source) {
      const engine::EngineStats& st = eng.stats();
      std::fprintf(stdout, "%s\n", spec_summary(st.draft_tokens, st.accepted_tokens, st.verifies).c_str());
    }
    std::fprintf(stdout, "Peak memory: %.3f GB\n", peak_rss_bytes() / 1e9);
  }
}

}  // namespace

void add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  a->model.add_to(cmd);
  cmd->add_option("-p,--prompt", a->prompt, "The prompt; \"-\" reads it from stdin (default: empty, i.e. start from BOS)");
  cmd->add_option("-m,--max-tokens", a->max_tokens, "Maximum number of tokens to generate")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--temp", a->temp, "Sampling temperature (0 = greedy)")->check(CLI::Range(0.0f, 100.0f))->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "Nucleus sampling: keep the top tokens with this much probability mass")
      ->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Keep only the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--min-p", a->min_p, "Drop tokens less likely than min-p times the most likely one")
      ->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  cmd->add_option("--repetition-penalty", a->repetition_penalty, "Penalty for tokens already in the context (1 = off)")
      ->check(CLI::Range(0.01f, 100.0f))->capture_default_str();
  cmd->add_option("--seed", a->seed, "Random seed (same seed, same tokens)");
  cmd->add_flag("--ignore-chat-template", a->chat.ignore_chat_template, "Use the raw prompt, without the model's chat template");
  a->chat.add_to(cmd);
  a->spec.add_to(cmd, 2);  // mlx_lm.generate's default
  a->prompt_cache.add_to(cmd);
  a->model.add_max_kv_size_to(cmd);
  auto* schema = cmd->add_option("--json-schema", a->json_schema, "Structured output: the output is JSON valid under this JSON Schema file")
                    ->check(CLI::ExistingFile);
  auto* gbnf = cmd->add_option("--grammar", a->grammar, "Structured output: the output follows this GBNF grammar file (llama.cpp's format)")
                   ->check(CLI::ExistingFile);
  auto* regex = cmd->add_option("--regex", a->regex, "Structured output: the output matches this regular expression (whole)");
  schema->excludes(gbnf)->excludes(regex);
  gbnf->excludes(regex);
  cmd->add_flag("--verbose", a->verbose,
                "Print prompt and generation speed, peak memory and, when drafting, how many drafts were accepted");
  cmd->callback([a] { run_generate(*a); });
}

}  // namespace kiln::cli
