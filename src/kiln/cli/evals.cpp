// kiln evals: the runs in the evals database (eval/evals_db.h). Lists runs (newest first; --task T as
// a table of that task's metrics, --model S to filter by path), or --compare A B: the metrics both
// runs have, side by side, B - A, and whether the difference exceeds two standard errors.
#include <cstdio>

#include "kiln/cli/commands.h"
#include "kiln/eval/evals_db.h"

namespace kiln::cli {

namespace {

struct EvalsArgs {
  std::string db, task, model;
  std::vector<int64_t> compare;
  int last = 20;
};

std::string short_model(const std::string& p) {
  const size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string value_se(double v, const std::optional<double>& se) {
  return se ? fmt::format("{:.4f} ± {:.4f}", v, *se) : fmt::format("{:.4f}", v);
}

void list(const eval::EvalsDb& db, const EvalsArgs& a) {
  auto runs = db.runs(a.task, a.model);
  if (runs.empty()) {
    std::printf("No runs%s%s.\n", a.task.empty() ? "" : (" of task " + a.task).c_str(),
                a.model.empty() ? "" : (" of a model matching " + a.model).c_str());
    return;
  }
  if (static_cast<int>(runs.size()) > a.last) runs.resize(static_cast<size_t>(a.last));
  if (a.task.empty()) {
    std::printf("%5s  %-20s  %-24s  %-16s  %-6s  %s\n", "run", "date", "model", "hash", "device", "tasks");
    for (const auto& r : runs) {
      std::string tasks;
      for (const auto& t : r.tasks) tasks += (tasks.empty() ? "" : " ") + t.task;
      std::printf("%5lld  %-20s  %-24.24s  %-16s  %-6s  %s\n", static_cast<long long>(r.id), r.info.date.c_str(),
                  short_model(r.info.model_path).c_str(), r.info.model_hash.c_str(), r.info.device.c_str(), tasks.c_str());
    }
    return;
  }
  // One task: a column per metric (name,filter) in the order first seen.
  std::vector<std::pair<std::string, std::string>> cols;
  for (const auto& r : runs)
    for (const auto& m : r.metrics)
      if (std::find(cols.begin(), cols.end(), std::pair{m.metric, m.filter}) == cols.end()) cols.emplace_back(m.metric, m.filter);
  std::printf("| run | date | model | quantization | n-shot | n | limit |");
  for (const auto& [m, f] : cols) std::printf(" %s%s |", m.c_str(), f == "none" ? "" : ("," + f).c_str());
  std::printf("\n|---|---|---|---|---:|---:|---:|");
  for (size_t i = 0; i < cols.size(); ++i) std::printf("---:|");
  std::printf("\n");
  for (const auto& r : runs) {
    const eval::StoredTask& t = r.tasks.at(0);
    std::printf("| %lld | %s | %s | %s | %d | %lld | %s |", static_cast<long long>(r.id), r.info.date.c_str(),
                short_model(r.info.model_path).c_str(), r.info.quantization.empty() ? "-" : r.info.quantization.c_str(),
                t.n_shot, static_cast<long long>(t.n_samples),
                r.info.limit < 0 ? "all" : fmt::format("{:g}", r.info.limit).c_str());
    for (const auto& [mn, f] : cols) {
      std::string cell = "";
      for (const auto& m : r.metrics)
        if (m.metric == mn && m.filter == f) cell = value_se(m.value, m.stderr_);
      std::printf(" %s |", cell.c_str());
    }
    std::printf("\n");
  }
}

void compare(const eval::EvalsDb& db, int64_t ia, int64_t ib) {
  const auto a = db.run(ia), b = db.run(ib);
  std::printf("A: run %lld  %s  %s  %s\nB: run %lld  %s  %s  %s\n\n", static_cast<long long>(a.id), a.info.date.c_str(),
              a.info.model_path.c_str(), a.info.model_hash.c_str(), static_cast<long long>(b.id), b.info.date.c_str(),
              b.info.model_path.c_str(), b.info.model_hash.c_str());
  const auto rows = eval::compare(a, b);
  if (rows.empty()) {
    std::printf("The runs have no task metric in common.\n");
    return;
  }
  std::printf("| task | metric | A | B | B - A | > 2 SE |\n|---|---|---:|---:|---:|:---:|\n");
  for (const auto& c : rows)
    std::printf("| %s | %s%s | %s | %s | %+.4f | %s |\n", c.task.c_str(), c.metric.c_str(),
                c.filter == "none" ? "" : ("," + c.filter).c_str(), value_se(c.a, c.se_a).c_str(),
                value_se(c.b, c.se_b).c_str(), c.delta, !c.se_a || !c.se_b ? "n/a" : c.significant ? "yes" : "no");
}

}  // namespace

void add_evals(CLI::App& app) {
  auto a = std::make_shared<EvalsArgs>();
  CLI::App* cmd = app.add_subcommand("evals", "List and compare the runs of kiln evaluate (the evals database)");
  cmd->add_option("--evals-db", a->db, "The evals database (default: ~/.cache/kiln/evals.sqlite)");
  cmd->add_option("--task", a->task, "Only runs of this task, as a table of its metrics");
  cmd->add_option("--model", a->model, "Only runs of models whose path contains this");
  cmd->add_option("--compare", a->compare, "Two run ids: their metrics side by side with deltas")->expected(2);
  cmd->add_option("--last", a->last, "At most this many runs, newest first")->capture_default_str();
  cmd->callback([a] {
    const std::string path = a->db.empty() ? eval::default_evals_db() : a->db;
    const eval::EvalsDb db(path);
    if (!a->compare.empty()) compare(db, a->compare[0], a->compare[1]);
    else list(db, *a);
  });
}

}  // namespace kiln::cli
