// Reading task data (datasets.h). bz2 through libbz2's one-shot stream API.
#include "kiln/eval/datasets.h"

#include <bzlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/base/error.h"

namespace kiln::eval {

namespace fs = std::filesystem;

std::string default_data_dir() {
  if (const char* e = std::getenv("KILN_EVAL_DATA"); e && *e) return e;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/kiln/eval-data";
}

bool has_file(const DataContext& ctx, const std::string& rel) { return fs::is_regular_file(fs::path(ctx.data_dir) / rel); }

std::string require_file(const DataContext& ctx, const std::string& task, const std::string& rel) {
  const fs::path p = fs::path(ctx.data_dir) / rel;
  if (!fs::is_regular_file(p))
    fail("eval", "task {} needs {}: not found in the data folder {} (looked for {}); pass --data-dir DIR or set "
         "KILN_EVAL_DATA (docs/evaluate.md lists the files)", task, rel, ctx.data_dir, p.string());
  return p.string();
}

namespace {

std::string bunzip2(const std::string& in, const std::string& path) {
  std::string out;
  bz_stream s{};
  if (BZ2_bzDecompressInit(&s, 0, 0) != BZ_OK) fail("eval", "{}: cannot start bz2 decompression", path);
  s.next_in = const_cast<char*>(in.data());
  s.avail_in = static_cast<unsigned>(in.size());
  char buf[1 << 16];
  int rc = BZ_OK;
  while (rc == BZ_OK) {
    s.next_out = buf;
    s.avail_out = sizeof buf;
    rc = BZ2_bzDecompress(&s);
    out.append(buf, sizeof buf - s.avail_out);
    if (rc == BZ_OK && s.avail_in == 0 && s.avail_out != 0) break;  // truncated input
  }
  BZ2_bzDecompressEnd(&s);
  if (rc != BZ_STREAM_END) fail("eval", "{}: corrupt or truncated bz2 data (code {})", path, rc);
  return out;
}

}  // namespace

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("eval", "cannot read {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".bz2") == 0) s = bunzip2(s, path);
  return s;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    std::string l = text.substr(b, e - b);
    if (!l.empty() && l.back() == '\r') l.pop_back();
    lines.push_back(std::move(l));
    b = e + 1;
  }
  return lines;
}

void RowErrors::bad(size_t line, const std::string& why) {
  if (ctx && ctx->strict) fail("eval", "{}:{}: malformed row ({}); --strict stops here", file, line, why);
  ++skipped;
}

std::vector<OrderedJson> read_jsonl(const std::string& path, RowErrors& err) {
  std::vector<OrderedJson> rows;
  err.file = path;
  const auto lines = split_lines(read_text(path));
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t") == std::string::npos) continue;
    try {
      OrderedJson j = OrderedJson::parse(lines[i]);
      if (!j.is_object()) {
        err.bad(i + 1, "not a JSON object");
        continue;
      }
      rows.push_back(std::move(j));
    } catch (const nlohmann::json::exception& e) {
      err.bad(i + 1, std::string("invalid JSON: ") + e.what());
    }
  }
  return rows;
}

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  const std::string t = read_text(path);
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (quoted) {
      if (c == '"' && i + 1 < t.size() && t[i + 1] == '"') field += t[++i];
      else if (c == '"') quoted = false;
      else field += c;
      continue;
    }
    if (c == '"') { quoted = true; any = true; }
    else if (c == ',') { row.push_back(std::move(field)); field.clear(); any = true; }
    else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
      if (any || !field.empty()) { row.push_back(std::move(field)); rows.push_back(std::move(row)); }
      row.clear(); field.clear(); any = false;
    } else { field += c; any = true; }
  }
  if (any || !field.empty()) { row.push_back(std::move(field)); rows.push_back(std::move(row)); }
  return rows;
}

}  // namespace kiln::eval
