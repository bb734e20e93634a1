// The task data on disk: the published files (JSONL, headerless CSV, label lists, text, .bz2) under
// a data folder, one subfolder per dataset (arc_easy/ARC-Easy-Test.jsonl, mmlu/test/<subject>_test.csv,
// ... as docs/evaluate.md lists them). A missing file is an error naming the file and the folder it
// was looked for in; a malformed row is skipped and counted, or an error under strict.
#pragma once
#include <string>
#include <vector>

#include "kiln/base/json.h"

namespace kiln::eval {

struct DataContext {
  std::string data_dir;  // resolved (default_data_dir() when the user gave none)
  bool strict = false;   // a malformed row is an error instead of skipped
};

// $KILN_EVAL_DATA, else ~/.cache/kiln/eval-data.
std::string default_data_dir();

// data_dir/rel when it exists; else throws "[eval] <task> needs <rel>: not found in <data_dir> (looked
// for <path>; set --data-dir ...)".
std::string require_file(const DataContext& ctx, const std::string& task, const std::string& rel);
bool has_file(const DataContext& ctx, const std::string& rel);

// A file's text; .bz2 files are decompressed.
std::string read_text(const std::string& path);
std::vector<std::string> split_lines(const std::string& text);  // "\n"-separated, a final "\r" dropped

// Counts the rows a loader leaves out; under strict the first one throws with file and line.
struct RowErrors {
  explicit RowErrors(const DataContext* c, std::string f = {}) : ctx(c), file(std::move(f)) {}
  const DataContext* ctx;
  std::string file;
  size_t skipped = 0;
  void bad(size_t line, const std::string& why);
};

// One JSON object per non-empty line (ordered keys: TruthfulQA's answers keep their file order).
std::vector<OrderedJson> read_jsonl(const std::string& path, RowErrors& err);
// RFC 4180 CSV (quotes, doubled quotes, newlines inside quotes), every record as its fields.
std::vector<std::vector<std::string>> read_csv(const std::string& path);

}  // namespace kiln::eval
