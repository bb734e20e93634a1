// kiln evaluate: lm-evaluation-harness's tasks on a model, with mlx_lm.evaluate's flags. Tasks are
// built in (eval/tasks.h) and read from local data files (--data-dir); the model answers through
// eval's loglikelihood / generate_until over the engine's ModelRunner. Prints lm-eval's table,
// draws a progress bar (requests/s, ETA) on stderr, and writes the results JSON in lm-eval's
// shape to --output-dir. Every run is also recorded in the evals database when one is open.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>

#include "kiln/chat/prompt.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/model_args.h"
#include "kiln/eval/evals_db.h"
#include "kiln/eval/harness.h"
#include "kiln/eval/tasks.h"

#include <sys/utsname.h>
#include <unistd.h>

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

namespace kiln::cli {

namespace {

namespace fs = std::filesystem;

struct EvaluateArgs {
  ModelArgs model;
  std::vector<std::string> tasks;
  std::string output_dir = ".", data_dir, chat_template_args, evals_db;
  bool no_evals_db = false, log_samples = false;
  int batch_size = 16, num_shots = -1, max_tokens = 0;
  double limit = -1;
  uint64_t seed = 123;
  bool apply_chat_template = false, no_apply_chat_template = false;  // neither: when the model has a template
  bool fewshot_as_multiturn = false, strict = false, no_prefix_grouping = false;
  float temp = 0.0f, top_p = 1.0f;
  int top_k = 0;
};

// "[evaluate] arc_easy [=====     ]  120/400 requests  35.2 req/s  ETA 0:08" on one stderr line.
class Progress {
 public:
  void update(const std::string& task, size_t done, size_t total) {
    using namespace std::chrono;
    if (task != task_) {
      task_ = task;
      t0_ = steady_clock::now();
    }
    const double s = duration<double>(steady_clock::now() - t0_).count();
    const double rate = s > 0 ? static_cast<double>(done) / s : 0;
    const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0;
    const int fill = total ? static_cast<int>(30.0 * static_cast<double>(done) / static_cast<double>(total)) : 30;
    std::fprintf(stderr, "\r[evaluate] %-24.24s [%.*s%*s] %zu/%zu requests  %.1f req/s  ETA %d:%02d ", task.c_str(),
                 fill, "==============================", 30 - fill, "", done, total, rate,
                 static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    if (done >= total) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  std::string task_;
  std::chrono::steady_clock::time_point t0_;
};

// config.json's quantization recipe (MLX "quantization", or HF "quantization_config"), compact; "" when none.
std::string quantization_of(const std::string& model_path) {
  const fs::path cfg = fs::path(model_path) / "config.json";
  if (!fs::is_regular_file(cfg)) return "";
  const Json j = read_json_file(cfg.string());
  for (const char* k : {"quantization", "quantization_config"})
    if (j.contains(k)) return j[k].dump();
  return "";
}

// "host (x86_64, cpu backend name)": where a run ran.
std::string machine_of(const engine::LoadedModel& m) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  utsname u{};
  uname(&u);
  return fmt::format("{} ({}, {})", host, u.machine, m.backend->name());
}

std::string now_iso() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// lm-eval's results table.
void print_table(const std::vector<eval::TaskResult>& rs) {
  std::printf("\n|%-28s|Version|%-16s|n-shot|%-15s|%10s|   |%8s|\n", "Tasks", "Filter", "Metric", "Value", "Stderr");
  std::printf("|%s|------:|%s|-----:|%s|%s|---|%s|\n", std::string(28, '-').c_str(), std::string(16, '-').c_str(),
              std::string(15, '-').c_str(), std::string(10, '-').c_str(), std::string(8, '-').c_str());
  for (const auto& r : rs) {
    bool first = true;
    for (const auto& m : r.metrics) {
      const std::string name = first ? (r.group.empty() || r.group == r.name ? r.name : " - " + r.name) : "";
      std::printf("|%-28.28s|%7s|%-16s|%6s|%-15s|%10.4f|%s|%8s|\n", name.c_str(),
                  first ? fmt::format("{:g}", r.version).c_str() : "", m.filter.c_str(),
                  first ? std::to_string(r.shots).c_str() : "", m.name.c_str(), m.value, m.has_stderr ? "±  " : "   ",
                  m.has_stderr ? fmt::format("{:.4f}", m.stderr_).c_str() : "N/A");
      first = false;
    }
  }
}

void run_evaluate(const EvaluateArgs& a) {
  eval::DataContext dctx{a.data_dir.empty() ? eval::default_data_dir() : a.data_dir, a.strict};
  // Tasks first: an unknown name or a missing file fails before the model loads.
  std::vector<eval::Task> tasks;
  for (const auto& name : a.tasks)
    for (auto& t : eval::load_tasks(name, dctx)) tasks.push_back(std::move(t));
  for (const auto& t : tasks)
    if (t.skipped_rows)
      std::fprintf(stderr, "[evaluate] %s: skipped %zu malformed rows of %s (--strict makes this an error)\n",
                   t.name.c_str(), t.skipped_rows, t.source.c_str());

  std::printf("Loading model from %s...\n", a.model.model.empty() ? "<embedded stories260K>" : a.model.model.c_str());
  auto m = a.model.load();
  eval::HarnessOptions ho;
  ho.limit = a.limit;
  ho.batch_size = a.batch_size;
  ho.group_prefixes = !a.no_prefix_grouping;
  ho.max_gen_toks = a.max_tokens;
  ho.log_samples = a.log_samples;
  ho.prompt.shots = a.num_shots;
  ho.prompt.fewshot_as_multiturn = a.fewshot_as_multiturn;
  ho.sampling.temperature = a.temp;
  ho.sampling.top_p = a.top_p;
  ho.sampling.top_k = a.top_k;
  ho.sampling.seed = a.seed;
  chat::TemplatePolicy policy;
  policy.kwargs = a.chat_template_args;
  policy.kwargs_flag = "--chat-template-args";
  auto renderer = std::make_shared<chat::Renderer>(policy.load(m->path, m->tokenizer.get()));
  const bool use_chat = a.apply_chat_template || (!a.no_apply_chat_template && renderer->chat_template() != nullptr);
  if (use_chat) {
    if (!renderer->chat_template()) fail("evaluate", "--apply-chat-template: the model has no chat template");
    ho.add_special_tokens = false;
    ho.prompt.chat = [renderer](const OrderedJson& msgs) { return renderer->render(msgs).text; };
  }
  if (a.fewshot_as_multiturn && !use_chat) fail("evaluate", "--fewshot-as-multiturn needs the chat template (--apply-chat-template)");
  Progress bar;
  ho.progress = [&bar](const std::string& t, size_t d, size_t n) { bar.update(t, d, n); };

  std::vector<eval::TaskResult> results;
  std::vector<eval::TaskResult> group_members;
  for (size_t i = 0; i < tasks.size(); ++i) {
    results.push_back(eval::run_task(tasks[i], *m, ho));
    const std::string& g = tasks[i].group;
    if (!g.empty()) group_members.push_back(results.back());
    const bool group_ends = !g.empty() && (i + 1 == tasks.size() || tasks[i + 1].group != g);
    if (group_ends && group_members.size() > 1) {
      eval::TaskResult agg = eval::aggregate_group(g, group_members);
      agg.group = g;
      results.insert(results.end() - static_cast<long>(group_members.size()), agg);
    }
    if (group_ends) group_members.clear();
  }
  print_table(results);

  OrderedJson config = {{"model", m->path},
                        {"model_fingerprint", fmt::format("{:016x}", m->fingerprint)},
                        {"device", a.model.load_options().device},
                        {"batch_size", a.batch_size},
                        {"limit", a.limit < 0 ? OrderedJson(nullptr) : OrderedJson(a.limit)},
                        {"num_fewshot", a.num_shots < 0 ? OrderedJson(nullptr) : OrderedJson(a.num_shots)},
                        {"seed", a.seed},
                        {"apply_chat_template", use_chat},
                        {"fewshot_as_multiturn", a.fewshot_as_multiturn},
                        {"gen_kwargs", {{"temperature", a.temp}, {"top_p", a.top_p}, {"top_k", a.top_k}, {"max_gen_toks", a.max_tokens}}},
                        {"data_dir", dctx.data_dir},
                        {"date", now_iso()}};
  const OrderedJson j = eval::results_json(results, config);
  fs::create_directories(a.output_dir);
  std::string stem = fs::path(m->path).filename().string();
  if (stem.empty() || stem[0] == '<') stem = "stories260K";
  std::string names;
  for (const auto& t : a.tasks) names += (names.empty() ? "" : "_") + fs::path(t).stem().string();
  const fs::path out = fs::path(a.output_dir) / ("eval_" + stem + "_" + names + ".json");
  std::ofstream f(out);
  f << j.dump(2) << "\n";
  if (!f) fail("evaluate", "cannot write {}", out.string());
  std::printf("\nResults written to %s\n", out.string().c_str());
  if (a.log_samples)
    for (const auto& r : results) {
      if (r.samples.empty()) continue;
      const fs::path sp = fs::path(a.output_dir) / ("samples_" + stem + "_" + r.name + ".jsonl");
      std::ofstream sf(sp);
      for (const auto& s : r.samples) sf << s.dump() << "\n";
      if (!sf) fail("evaluate", "cannot write {}", sp.string());
      std::printf("Samples written to %s\n", sp.string().c_str());
    }
  if (a.no_evals_db) return;
  eval::RunInfo info;
  info.date = config["date"];
  info.model_path = m->path;
  info.model_hash = config["model_fingerprint"];
  info.quantization = quantization_of(m->path);
  info.device = config["device"];
  info.machine = machine_of(*m);
  info.kiln_version = KILN_VERSION;
  info.limit = a.limit;
  info.num_shots = a.num_shots;
  info.seed = a.seed;
  info.batch_size = a.batch_size;
  info.config_json = config.dump();
  const std::string db_path = a.evals_db.empty() ? eval::default_evals_db() : a.evals_db;
  const int64_t id = eval::EvalsDb(db_path).record(info, results);
  std::printf("Recorded as run %lld in %s (`kiln evals`)\n", static_cast<long long>(id), db_path.c_str());
}

}  // namespace

void add_evaluate(CLI::App& app) {
  auto a = std::make_shared<EvaluateArgs>();
  CLI::App* cmd = app.add_subcommand("evaluate", "Evaluate a model on lm-evaluation-harness tasks (local data files)");
  a->model.add_to(cmd);
  cmd->add_option("--tasks", a->tasks, "Tasks: arc_easy arc_challenge piqa hellaswag winogrande lambada_openai wikitext "
                                       "gsm8k mmlu mmlu_<subject> truthfulqa_mc1 truthfulqa_mc2, or a custom task .json")
      ->required()->expected(1, -1);
  cmd->add_option("--output-dir", a->output_dir, "Folder for the results JSON")->capture_default_str();
  cmd->add_option("--data-dir", a->data_dir,
                  "Folder of the task data files (default: $KILN_EVAL_DATA, else ~/.cache/kiln/eval-data; docs/evaluate.md)");
  cmd->add_option("--batch-size", a->batch_size, "Requests per forward")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--num-shots", a->num_shots, "Few-shot examples (default: the task's: 5 for mmlu and gsm8k, else 0)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-tokens", a->max_tokens, "Maximum tokens generated per generate_until request (default: the task's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--limit", a->limit, "Docs per task: a count, or a fraction when below 1 (default: all)");
  cmd->add_option("--seed", a->seed, "Seed of sampled generation")->capture_default_str();
  cmd->add_flag("--fewshot-as-multiturn", a->fewshot_as_multiturn, "Few-shot examples as user/assistant turns (needs the chat template)");
  auto* on = cmd->add_flag("--apply-chat-template", a->apply_chat_template,
                           "Prompts through the model's chat template (default: when the model has one)");
  cmd->add_flag("--no-apply-chat-template", a->no_apply_chat_template, "Plain text prompts, even when the model has a chat template")
      ->excludes(on);
  cmd->add_option("--chat-template-args", a->chat_template_args, "Extra chat template arguments as a JSON object");
  cmd->add_option("--temp", a->temp, "Sampling temperature of generate_until (0: greedy)")->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "Sampling top-p")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Sampling top-k (0: off)")->capture_default_str();
  cmd->add_option("--evals-db", a->evals_db, "The evals database every run is recorded in (default: ~/.cache/kiln/evals.sqlite)");
  cmd->add_flag("--no-evals-db", a->no_evals_db, "Do not record this run in the evals database");
  cmd->add_flag("--log-samples", a->log_samples,
                "Also write samples_<model>_<task>.jsonl: every doc's requests (text and token ids) and answers");
  cmd->add_flag("--strict", a->strict, "A malformed data row is an error (default: skipped and counted)");
  cmd->add_flag("--no-prefix-grouping", a->no_prefix_grouping,
                "Score every loglikelihood request whole (default: a shared context is computed once)");
  cmd->callback([a] { run_evaluate(*a); });
}

}  // namespace kiln::cli
