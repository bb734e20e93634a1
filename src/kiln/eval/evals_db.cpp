// The evals database (evals_db.h) over the SQLite C API: prepared statements with bound values,
// one transaction per recorded run.
#include "kiln/eval/evals_db.h"

#include <sqlite3.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "kiln/base/error.h"

namespace kiln::eval {

namespace {

constexpr const char* kSchema = R"(
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  date TEXT NOT NULL, model_path TEXT NOT NULL, model_hash TEXT NOT NULL, quantization TEXT NOT NULL,
  device TEXT NOT NULL, machine TEXT NOT NULL, kiln_version TEXT NOT NULL,
  limit_docs REAL NOT NULL, num_shots INTEGER NOT NULL, seed INTEGER NOT NULL, batch_size INTEGER NOT NULL,
  config TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS task_results (
  run_id INTEGER NOT NULL REFERENCES runs(id), task TEXT NOT NULL, version REAL NOT NULL, n_shot INTEGER NOT NULL,
  n_samples INTEGER NOT NULL, seconds REAL NOT NULL, PRIMARY KEY (run_id, task));
CREATE TABLE IF NOT EXISTS metrics (
  run_id INTEGER NOT NULL REFERENCES runs(id), task TEXT NOT NULL, metric TEXT NOT NULL, filter TEXT NOT NULL,
  value REAL NOT NULL, stderr REAL, PRIMARY KEY (run_id, task, metric, filter));
CREATE INDEX IF NOT EXISTS task_results_task ON task_results(task);
)";

// A prepared statement, finalized on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& sql, const std::string& path) : db_(db), path_(path) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s_, nullptr) != SQLITE_OK)
      fail("evals", "{}: {} ({})", path, sqlite3_errmsg(db), sql);
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt& bind(int i, const std::string& v) { return check(sqlite3_bind_text(s_, i, v.c_str(), -1, SQLITE_TRANSIENT)); }
  Stmt& bind(int i, double v) { return check(sqlite3_bind_double(s_, i, v)); }
  Stmt& bind(int i, int64_t v) { return check(sqlite3_bind_int64(s_, i, v)); }
  Stmt& bind_null(int i) { return check(sqlite3_bind_null(s_, i)); }
  bool step() {
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail("evals", "{}: {}", path_, sqlite3_errmsg(db_));
  }
  std::string text(int c) const {
    const auto* p = sqlite3_column_text(s_, c);
    return p ? reinterpret_cast<const char*>(p) : "";
  }
  double real(int c) const { return sqlite3_column_double(s_, c); }
  int64_t integer(int c) const { return sqlite3_column_int64(s_, c); }
  bool is_null(int c) const { return sqlite3_column_type(s_, c) == SQLITE_NULL; }

 private:
  Stmt& check(int rc) {
    if (rc != SQLITE_OK) fail("evals", "{}: {}", path_, sqlite3_errmsg(db_));
    return *this;
  }
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  std::string path_;
};

constexpr const char* kRunColumns =
    "id, date, model_path, model_hash, quantization, device, machine, kiln_version, limit_docs, num_shots, seed, "
    "batch_size, config";

StoredRun read_run(const Stmt& s) {
  StoredRun r;
  r.id = s.integer(0);
  r.info.date = s.text(1);
  r.info.model_path = s.text(2);
  r.info.model_hash = s.text(3);
  r.info.quantization = s.text(4);
  r.info.device = s.text(5);
  r.info.machine = s.text(6);
  r.info.kiln_version = s.text(7);
  r.info.limit = s.real(8);
  r.info.num_shots = static_cast<int>(s.integer(9));
  r.info.seed = static_cast<uint64_t>(s.integer(10));
  r.info.batch_size = static_cast<int>(s.integer(11));
  r.info.config_json = s.text(12);
  return r;
}

}  // namespace

std::string default_evals_db() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/kiln/evals.sqlite";
}

EvalsDb::EvalsDb(const std::string& path) : path_(path) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    fail("evals", "cannot open the evals database {}: {}", path, why);
  }
  sqlite3_busy_timeout(db_, 5000);  // another kiln recording at the same time
  exec(kSchema);
}

EvalsDb::~EvalsDb() { sqlite3_close(db_); }

void EvalsDb::exec(const std::string& sql) const {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string why = err ? err : "?";
    sqlite3_free(err);
    fail("evals", "{}: {}", path_, why);
  }
}

int64_t EvalsDb::record(const RunInfo& info, const std::vector<TaskResult>& results) {
  exec("BEGIN IMMEDIATE");
  try {
    Stmt s(db_, std::string("INSERT INTO runs (") + (kRunColumns + 4) + ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", path_);
    s.bind(1, info.date).bind(2, info.model_path).bind(3, info.model_hash).bind(4, info.quantization).bind(5, info.device);
    s.bind(6, info.machine).bind(7, info.kiln_version).bind(8, info.limit).bind(9, static_cast<int64_t>(info.num_shots));
    s.bind(10, static_cast<int64_t>(info.seed)).bind(11, static_cast<int64_t>(info.batch_size)).bind(12, info.config_json);
    s.step();
    const int64_t id = sqlite3_last_insert_rowid(db_);
    for (const auto& r : results) {
      Stmt t(db_, "INSERT INTO task_results VALUES (?,?,?,?,?,?)", path_);
      t.bind(1, id).bind(2, r.name).bind(3, r.version).bind(4, static_cast<int64_t>(r.shots));
      t.bind(5, static_cast<int64_t>(r.n_docs)).bind(6, r.seconds);
      t.step();
      for (const auto& m : r.metrics) {
        Stmt q(db_, "INSERT INTO metrics VALUES (?,?,?,?,?,?)", path_);
        q.bind(1, id).bind(2, r.name).bind(3, m.name).bind(4, m.filter).bind(5, m.value);
        if (m.has_stderr) q.bind(6, m.stderr_);
        else q.bind_null(6);
        q.step();
      }
    }
    exec("COMMIT");
    return id;
  } catch (...) {
    exec("ROLLBACK");
    throw;
  }
}

namespace {

void fill(sqlite3* db, const std::string& path, StoredRun& r, const std::string& task) {
  const std::string where = task.empty() ? " WHERE run_id = ?" : " WHERE run_id = ? AND task = ?";
  {
    Stmt s(db, "SELECT task, version, n_shot, n_samples, seconds FROM task_results" + where + " ORDER BY rowid", path);
    s.bind(1, r.id);
    if (!task.empty()) s.bind(2, task);
    while (s.step()) r.tasks.push_back({s.text(0), s.real(1), static_cast<int>(s.integer(2)), s.integer(3), s.real(4)});
  }
  Stmt s(db, "SELECT task, metric, filter, value, stderr FROM metrics" + where + " ORDER BY rowid", path);
  s.bind(1, r.id);
  if (!task.empty()) s.bind(2, task);
  while (s.step()) {
    StoredMetric m{s.text(0), s.text(1), s.text(2), s.real(3), std::nullopt};
    if (!s.is_null(4)) m.stderr_ = s.real(4);
    r.metrics.push_back(std::move(m));
  }
}

}  // namespace

std::vector<StoredRun> EvalsDb::runs(const std::string& task, const std::string& model) const {
  std::string sql = std::string("SELECT ") + kRunColumns + " FROM runs WHERE 1";
  if (!task.empty()) sql += " AND id IN (SELECT run_id FROM task_results WHERE task = ?1)";
  if (!model.empty()) sql += " AND instr(model_path, ?2) > 0";
  sql += " ORDER BY id DESC";
  Stmt s(db_, sql, path_);
  if (!task.empty()) s.bind(1, task);
  if (!model.empty()) s.bind(2, model);
  std::vector<StoredRun> out;
  while (s.step()) out.push_back(read_run(s));
  for (auto& r : out) fill(db_, path_, r, task);
  return out;
}

StoredRun EvalsDb::run(int64_t id) const {
  Stmt s(db_, std::string("SELECT ") + kRunColumns + " FROM runs WHERE id = ?", path_);
  s.bind(1, id);
  if (!s.step()) fail("evals", "{} has no run {} (`kiln evals` lists the runs)", path_, id);
  StoredRun r = read_run(s);
  fill(db_, path_, r, "");
  return r;
}

std::vector<Comparison> compare(const StoredRun& a, const StoredRun& b) {
  std::vector<Comparison> out;
  for (const auto& ma : a.metrics) {
    for (const auto& mb : b.metrics) {
      if (ma.task != mb.task || ma.metric != mb.metric || ma.filter != mb.filter) continue;
      Comparison c{ma.task, ma.metric, ma.filter, ma.value, mb.value, mb.value - ma.value, ma.stderr_, mb.stderr_, false};
      if (ma.stderr_ && mb.stderr_) {
        const double se = std::sqrt(*ma.stderr_ * *ma.stderr_ + *mb.stderr_ * *mb.stderr_);
        c.significant = std::abs(c.delta) > 2 * se;
      }
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace kiln::eval
