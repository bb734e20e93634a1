// Custom JSON tasks (custom_task.h).
#include "kiln/eval/custom_task.h"

#include <filesystem>

#include "kiln/base/error.h"

namespace kiln::eval {

namespace fs = std::filesystem;

namespace {

const OrderedJson* lookup(const OrderedJson& row, const std::string& path) {
  const OrderedJson* v = &row;
  size_t b = 0;
  while (b <= path.size()) {
    size_t e = path.find('.', b);
    if (e == std::string::npos) e = path.size();
    const std::string k = path.substr(b, e - b);
    if (v->is_object() && v->contains(k)) v = &(*v)[k];
    else if (v->is_array() && !k.empty() && std::all_of(k.begin(), k.end(), ::isdigit) && std::stoul(k) < v->size())
      v = &(*v)[std::stoul(k)];
    else return nullptr;
    b = e + 1;
  }
  return v;
}

std::string as_text(const OrderedJson& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// "{{field}}" alone -> the field's value itself (a list stays a list).
const OrderedJson* whole_field(const std::string& tmpl, const OrderedJson& row) {
  if (tmpl.size() < 4 || tmpl.rfind("{{", 0) != 0 || tmpl.compare(tmpl.size() - 2, 2, "}}") != 0) return nullptr;
  if (tmpl.find("{{", 2) != std::string::npos) return nullptr;
  return lookup(row, trim(tmpl.substr(2, tmpl.size() - 4)));
}

}  // namespace

std::string render_template(const std::string& tmpl, const OrderedJson& row, const std::string& where) {
  std::string out;
  size_t i = 0;
  while (i < tmpl.size()) {
    const size_t a = tmpl.find("{{", i);
    if (a == std::string::npos) break;
    const size_t b = tmpl.find("}}", a + 2);
    if (b == std::string::npos) fail("eval", "{}: unclosed {{{{ in template \"{}\"", where, tmpl);
    out.append(tmpl, i, a - i);
    const std::string key = trim(tmpl.substr(a + 2, b - a - 2));
    const OrderedJson* v = lookup(row, key);
    if (!v) fail("eval", "{}: the row has no field \"{}\"", where, key);
    out += as_text(*v);
    i = b + 2;
  }
  out.append(tmpl, i, std::string::npos);
  return out;
}

Task load_custom_task(const std::string& json_path, const DataContext& ctx) {
  const OrderedJson c = parse_ordered_json(read_text(json_path), json_path, "eval");
  auto str = [&](const char* k, const std::string& dflt) {
    if (!c.contains(k)) return dflt;
    if (!c[k].is_string()) fail("eval", "{}: \"{}\" must be a string", json_path, k);
    return c[k].get<std::string>();
  };
  Task t;
  t.name = str("name", fs::path(json_path).stem().string());
  const std::string type = str("output_type", "multiple_choice");
  const std::string metric = str("metric", type == "generate_until" ? "exact_match" : "acc");
  if (type == "multiple_choice") t.output_type = OutputType::multiple_choice, t.scoring = Scoring::choice;
  else if (type == "generate_until") t.output_type = OutputType::generate_until, t.scoring = Scoring::exact;
  else if (type == "loglikelihood") t.output_type = OutputType::loglikelihood, t.scoring = Scoring::lambada;
  else if (type == "loglikelihood_rolling") t.output_type = OutputType::loglikelihood_rolling, t.scoring = Scoring::rolling;
  else fail("eval", "{}: output_type \"{}\" is not multiple_choice, generate_until, loglikelihood or loglikelihood_rolling", json_path, type);
  t.acc_norm = metric == "acc_norm";
  t.description = str("description", "");
  t.target_delimiter = str("target_delimiter", " ");
  t.fewshot_delimiter = str("fewshot_delimiter", "\n\n");
  t.default_shots = c.value("num_fewshot", 0);
  t.max_gen_toks = c.value("max_gen_toks", 256);
  if (c.contains("until")) t.until = c["until"].get<std::vector<std::string>>();
  const std::string dataset = str("dataset", "");
  if (dataset.empty()) fail("eval", "{}: \"dataset\" (a JSONL file) is required", json_path);
  fs::path dp = dataset;
  if (dp.is_relative()) dp = fs::path(json_path).parent_path() / dp;
  if (!fs::is_regular_file(dp)) fail("eval", "task {} needs its dataset {}: not found (looked for {})", t.name, dataset, dp.string());
  const std::string text_t = str("doc_to_text", ""), target_t = str("doc_to_target", "");
  RowErrors err{&ctx};
  auto rows = read_jsonl(dp.string(), err);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const std::string where = dp.string() + ":" + std::to_string(i + 1);
    try {
      Doc d;
      d.query = render_template(text_t, r, where);
      if (t.output_type == OutputType::multiple_choice) {
        if (!c.contains("doc_to_choice")) fail("eval", "{}: multiple_choice needs doc_to_choice", json_path);
        const auto& dc = c["doc_to_choice"];
        if (dc.is_array()) {
          for (const auto& ch : dc) d.choices.push_back(render_template(ch.get<std::string>(), r, where));
        } else {
          const OrderedJson* v = whole_field(dc.get<std::string>(), r);
          if (!v || !v->is_array()) fail("eval", "{}: doc_to_choice must name a list field", where);
          for (const auto& ch : *v) d.choices.push_back(as_text(ch));
        }
        const OrderedJson* tv = whole_field(target_t, r);
        if (tv && tv->is_number_integer()) d.gold = tv->get<int>();
        else {
          const std::string s = render_template(target_t, r, where);
          auto it = std::find(d.choices.begin(), d.choices.end(), s);
          if (it != d.choices.end()) d.gold = static_cast<int>(it - d.choices.begin());
          else if (!s.empty() && std::all_of(s.begin(), s.end(), ::isdigit)) d.gold = std::stoi(s);
          else fail("eval", "{}: the target \"{}\" is neither a choice nor an index", where, s);
        }
        if (d.gold < 0 || d.gold >= static_cast<int>(d.choices.size())) fail("eval", "{}: target index {} out of range", where, d.gold);
      } else {
        d.target = render_template(target_t, r, where);
        if (t.output_type == OutputType::loglikelihood_rolling) d.original = d.target = d.query + d.target;
      }
      t.docs.push_back(std::move(d));
    } catch (const Error& e) {
      err.bad(i + 1, e.what());
    }
  }
  t.skipped_rows = err.skipped;
  t.source = dp.string();
  return t;
}

}  // namespace kiln::eval
