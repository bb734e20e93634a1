// The evals database: every `kiln evaluate` run in SQLite (~/.cache/kiln/evals.sqlite by default),
// so that results of models, quantizations and kiln versions can be listed and compared later.
// Tables: runs (one per invocation: model identity, settings, where and when), task_results (one per
// task of a run) and metrics (one per task, metric and filter, with its standard error).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/eval/harness.h"

struct sqlite3;

namespace kiln::eval {

struct RunInfo {
  std::string date;          // ISO 8601 UTC
  std::string model_path, model_hash, quantization;  // hash: the weights' fingerprint; quantization: config.json's recipe
  std::string device, machine, kiln_version;
  double limit = -1;
  int num_shots = -1;        // the flag (-1: the tasks' defaults; each task's count is in its result)
  uint64_t seed = 0;
  int batch_size = 0;
  std::string config_json;   // the results JSON's config
};

struct StoredMetric {
  std::string task, metric, filter;
  double value = 0;
  std::optional<double> stderr_;
};

struct StoredTask {
  std::string task;
  double version = 0;
  int n_shot = 0;
  int64_t n_samples = 0;
  double seconds = 0;
};

struct StoredRun {
  int64_t id = 0;
  RunInfo info;
  std::vector<StoredTask> tasks;
  std::vector<StoredMetric> metrics;
};

class EvalsDb {
 public:
  // Opens (creating the file, its folder and the tables) or throws [evals] naming the path.
  explicit EvalsDb(const std::string& path);
  ~EvalsDb();
  EvalsDb(const EvalsDb&) = delete;
  EvalsDb& operator=(const EvalsDb&) = delete;

  // Stores a run and its results in one transaction; returns the run id.
  int64_t record(const RunInfo& info, const std::vector<TaskResult>& results);
  // Runs, newest first; task: only runs with that task (and only its results); model: runs whose
  // path contains it.
  std::vector<StoredRun> runs(const std::string& task = "", const std::string& model = "") const;
  // One run, or throws [evals] when no run has that id.
  StoredRun run(int64_t id) const;

 private:
  void exec(const std::string& sql) const;
  std::string path_;
  sqlite3* db_ = nullptr;
};

// ~/.cache/kiln/evals.sqlite
std::string default_evals_db();

// A comparison's row: the metric in both runs, B - A, and whether |B - A| exceeds two standard
// errors of the difference, 2 * sqrt(se_A^2 + se_B^2) (false without standard errors).
struct Comparison {
  std::string task, metric, filter;
  double a = 0, b = 0, delta = 0;
  std::optional<double> se_a, se_b;
  bool significant = false;
};
// The metrics both runs have, in A's order.
std::vector<Comparison> compare(const StoredRun& a, const StoredRun& b);

}  // namespace kiln::eval
