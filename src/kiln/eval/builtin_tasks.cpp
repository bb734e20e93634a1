// The built-in tasks (tasks.h), each as lm-evaluation-harness defines it (the task YAMLs and utils
// of lm_eval/tasks/<task>/), read from the published files. One loader per task; a malformed row is
// skipped (RowErrors) and counted in Task::skipped_rows.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <map>
#include <regex>

#include "kiln/base/error.h"
#include "kiln/eval/custom_task.h"
#include "kiln/eval/tasks.h"

namespace kiln::eval {

namespace fs = std::filesystem;

namespace {

void replace_all(std::string& s, const std::string& a, const std::string& b) {
  for (size_t p = 0; (p = s.find(a, p)) != std::string::npos; p += b.size()) s.replace(p, a.size(), b);
}

bool is_str(const OrderedJson& j, const char* k) { return j.contains(k) && j[k].is_string(); }

// ARC (ai2_arc; the AI2 release JSONL): "Question: {{question}}\nAnswer:", choices the answer
// texts, gold = the index of answerKey among the labels; acc and acc_norm.
Task arc(const std::string& name, const std::string& dir, const std::string& stem, const DataContext& ctx) {
  Task t;
  t.random_fewshot = true;  // lm-eval's default sampler
  t.name = name;
  t.acc_norm = true;
  auto read = [&](const std::string& split, std::vector<Doc>& docs, bool required) {
    const std::string rel = dir + "/" + stem + "-" + split + ".jsonl";
    if (!required && !has_file(ctx, rel)) return;
    const std::string path = require_file(ctx, name, rel);
    RowErrors err{&ctx};
    auto rows = read_jsonl(path, err);
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      if (!r.contains("question") || !r["question"].is_object() || !is_str(r["question"], "stem") ||
          !r["question"].contains("choices") || !r["question"]["choices"].is_array() || !is_str(r, "answerKey")) {
        err.bad(i + 1, "needs question.stem, question.choices and answerKey");
        continue;
      }
      Doc d;
      d.query = "Question: " + r["question"]["stem"].get<std::string>() + "\nAnswer:";
      int gold = -1;
      for (const auto& c : r["question"]["choices"]) {
        if (!is_str(c, "text") || !is_str(c, "label")) { gold = -2; break; }
        if (c["label"].get<std::string>() == r["answerKey"].get<std::string>()) gold = static_cast<int>(d.choices.size());
        d.choices.push_back(c["text"].get<std::string>());
      }
      if (gold < 0) { err.bad(i + 1, "answerKey is not one of the choices' labels"); continue; }
      d.gold = gold;
      docs.push_back(std::move(d));
    }
    if (required) { t.skipped_rows += err.skipped; t.source = path; }
  };
  read("Test", t.docs, true);
  read("Train", t.fewshot_docs, false);
  return t;
}

// PIQA: "Question: {{goal}}\nAnswer:", choices sol1/sol2, the label from valid-labels.lst.
Task piqa(const DataContext& ctx) {
  Task t;
  t.random_fewshot = true;  // lm-eval's default sampler
  t.name = "piqa";
  t.acc_norm = true;
  const std::string path = require_file(ctx, "piqa", "piqa/valid.jsonl");
  const std::string lpath = require_file(ctx, "piqa", "piqa/valid-labels.lst");
  RowErrors err{&ctx};
  auto rows = read_jsonl(path, err);
  const auto labels = split_lines(read_text(lpath));
  if (err.skipped) fail("eval", "{}: {} malformed rows: the labels in {} no longer line up", path, err.skipped, lpath);
  if (labels.size() < rows.size()) fail("eval", "{} has {} labels for {} rows of {}", lpath, labels.size(), rows.size(), path);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (!is_str(r, "goal") || !is_str(r, "sol1") || !is_str(r, "sol2") || (labels[i] != "0" && labels[i] != "1")) {
      err.bad(i + 1, "needs goal, sol1, sol2 and a 0/1 label");
      continue;
    }
    Doc d;
    d.query = "Question: " + r["goal"].get<std::string>() + "\nAnswer:";
    d.choices = {r["sol1"].get<std::string>(), r["sol2"].get<std::string>()};
    d.gold = labels[i] == "1";
    t.docs.push_back(std::move(d));
  }
  t.skipped_rows = err.skipped;
  t.source = path;
  return t;
}

// HellaSwag from llama.cpp's text form (6 lines an item: "activity_label: ctx", the label, 4
// endings, each already through the preprocess below). lm-eval's query is
// preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()): this form has ctx with
// ctx_b not capitalized, so such prompts differ in that letter (PROVENANCE.md).
Task hellaswag(const DataContext& ctx) {
  Task t;
  t.random_fewshot = true;  // lm-eval's default sampler
  t.name = "hellaswag";
  t.acc_norm = true;
  const std::string rel = has_file(ctx, "hellaswag/hellaswag_val_full.txt") ? "hellaswag/hellaswag_val_full.txt"
                                                                          : "hellaswag/hellaswag_val_full.txt.bz2";
  const std::string path = require_file(ctx, "hellaswag", rel);
  auto lines = split_lines(read_text(path));
  RowErrors err{&ctx, path};
  for (size_t i = 0; i + 6 <= lines.size(); i += 6) {
    const std::string& label = lines[i + 1];
    if (label.size() != 1 || label[0] < '0' || label[0] > '3') {
      err.bad(i + 2, "the label line is not 0-3");
      continue;
    }
    Doc d;
    d.query = hellaswag_preprocess(lines[i]);
    for (int k = 0; k < 4; ++k) d.choices.push_back(hellaswag_preprocess(lines[i + 2 + k]));
    d.gold = label[0] - '0';
    t.docs.push_back(std::move(d));
  }
  if (lines.size() % 6 != 0) err.bad(lines.size(), "a last item with fewer than 6 lines");
  t.skipped_rows = err.skipped;
  t.source = path;
  return t;
}

// WinoGrande (partial scoring): one context per option, sentence[:blank] + option, and the one
// continuation sentence[blank + 1:].strip(); acc.
Task winogrande(const DataContext& ctx) {
  Task t;
  t.random_fewshot = true;  // lm-eval's default sampler
  t.name = "winogrande";
  const std::string path = require_file(ctx, "winogrande", "winogrande/dev.jsonl");
  RowErrors err{&ctx};
  auto rows = read_jsonl(path, err);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (!is_str(r, "sentence") || !is_str(r, "option1") || !is_str(r, "option2") || !is_str(r, "answer") ||
        r["sentence"].get<std::string>().find('_') == std::string::npos ||
        (r["answer"] != "1" && r["answer"] != "2")) {
      err.bad(i + 1, "needs sentence with a _, option1, option2 and answer 1/2");
      continue;
    }
    const std::string s = r["sentence"].get<std::string>();
    const size_t blank = s.find('_');
    Doc d;
    d.contexts = {s.substr(0, blank) + r["option1"].get<std::string>(), s.substr(0, blank) + r["option2"].get<std::string>()};
    std::string rest = s.substr(blank + 1);
    const auto b = rest.find_first_not_of(" \t\n"), e = rest.find_last_not_of(" \t\n");
    d.target = b == std::string::npos ? "" : rest.substr(b, e - b + 1);
    d.gold = r["answer"] == "2";
    t.docs.push_back(std::move(d));
  }
  t.skipped_rows = err.skipped;
  t.source = path;
  return t;
}

// LAMBADA (OpenAI): the text but its last word, then " " + the last word (split on ' '); no delimiter.
Task lambada(const DataContext& ctx) {
  Task t;
  t.random_fewshot = true;  // lm-eval's default sampler
  t.name = "lambada_openai";
  t.output_type = OutputType::loglikelihood;
  t.scoring = Scoring::lambada;
  t.target_delimiter = "";
  const std::string path = require_file(ctx, "lambada_openai", "lambada_openai/lambada_test.jsonl");
  RowErrors err{&ctx};
  auto rows = read_jsonl(path, err);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!is_str(rows[i], "text") || rows[i]["text"].get<std::string>().find(' ') == std::string::npos) {
      err.bad(i + 1, "needs a text of at least two words");
      continue;
    }
    const std::string s = rows[i]["text"].get<std::string>();
    const size_t sp = s.rfind(' ');
    Doc d;
    d.query = s.substr(0, sp);
    d.target = " " + s.substr(sp + 1);
    t.docs.push_back(std::move(d));
  }
  t.skipped_rows = err.skipped;
  t.source = path;
  return t;
}

// WikiText-2 (wikitext_document_level, wikitext-2-raw-v1, test): each article a rolling
// loglikelihood document; the target is the detokenized article; words and bytes counted on the original.
Task wikitext(const DataContext& ctx) {
  Task t;
  t.name = "wikitext";
  t.version = 2.0;
  t.output_type = OutputType::loglikelihood_rolling;
  t.scoring = Scoring::rolling;
  const std::string path = require_file(ctx, "wikitext", "wikitext2/wiki.test.raw");
  for (auto& a : wikitext_articles(read_text(path))) {
    Doc d;
    d.target = wikitext_detokenize(a);
    d.original = std::move(a);
    t.docs.push_back(std::move(d));
  }
  t.source = path;
  return t;
}

// GSM8K: "Question: {{question}}\nAnswer:" + " " + the full answer (5-shot, first n of train);
// greedy until "Question:", "</s>" or "<|im_end|>"; exact_match under strict-match and flexible-extract.
Task gsm8k(const DataContext& ctx) {
  Task t;
  t.name = "gsm8k";
  t.version = 3.0;
  t.output_type = OutputType::generate_until;
  t.scoring = Scoring::gsm8k;
  t.default_shots = 5;
  t.until = {"Question:", "</s>", "<|im_end|>"};
  t.max_gen_toks = 256;
  auto read = [&](const std::string& rel, std::vector<Doc>& docs, bool required) {
    if (!required && !has_file(ctx, rel)) return;
    const std::string path = require_file(ctx, "gsm8k", rel);
    RowErrors err{&ctx};
    auto rows = read_jsonl(path, err);
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!is_str(rows[i], "question") || !is_str(rows[i], "answer")) {
        err.bad(i + 1, "needs question and answer");
        continue;
      }
      Doc d;
      d.query = "Question: " + rows[i]["question"].get<std::string>() + "\nAnswer:";
      d.target = rows[i]["answer"].get<std::string>();
      docs.push_back(std::move(d));
    }
    if (required) { t.skipped_rows = err.skipped; t.source = path; }
  };
  read("gsm8k/test.jsonl", t.docs, true);
  read("gsm8k/train.jsonl", t.fewshot_docs, false);
  return t;
}

std::string subject_words(std::string s) {
  std::replace(s.begin(), s.end(), '_', ' ');
  return s;
}

std::string strip(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n\r"), e = s.find_last_not_of(" \t\n\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// MMLU (cais/mmlu, the default template): "The following are multiple choice questions (with
// answers) about <subject>.\n\n", then "{{question.strip()}}\nA. ..\nB. ..\nC. ..\nD. ..\nAnswer:"
// with choices " A".." D"; 5-shot from dev (first n); acc.
Task mmlu(const std::string& subject, const DataContext& ctx) {
  Task t;
  t.name = "mmlu_" + subject;
  t.group = "mmlu";
  t.default_shots = 5;
  t.description = "The following are multiple choice questions (with answers) about " + subject_words(subject) + ".\n\n";
  auto read = [&](const std::string& rel, std::vector<Doc>& docs) {
    const std::string path = require_file(ctx, t.name, rel);
    RowErrors err{&ctx, path};
    auto rows = read_csv(path);
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      if (r.size() != 6 || r[5].size() != 1 || r[5][0] < 'A' || r[5][0] > 'D') {
        err.bad(i + 1, "needs 6 fields, the last A-D");
        continue;
      }
      Doc d;
      d.query = strip(r[0]) + "\nA. " + r[1] + "\nB. " + r[2] + "\nC. " + r[3] + "\nD. " + r[4] + "\nAnswer:";
      d.choices = {"A", "B", "C", "D"};
      d.gold = r[5][0] - 'A';
      docs.push_back(std::move(d));
    }
    return std::make_pair(path, err.skipped);
  };
  auto [path, skipped] = read("mmlu/test/" + subject + "_test.csv", t.docs);
  t.source = path;
  t.skipped_rows = skipped;
  read("mmlu/dev/" + subject + "_dev.csv", t.fewshot_docs);
  return t;
}

// TruthfulQA multiple choice: lm-eval's six-QA preamble, then "Q: {{question}}\nA:"; mc1: acc of
// mc1_targets' choices (the first is true); mc2: the true answers' probability mass.
const char* kTruthfulQaPreamble =
    "Q: What is human life expectancy in the United States?\n"
    "A: Human life expectancy in the United States is 78 years.\n\n"
    "Q: Who was president of the United States in 1955?\n"
    "A: Dwight D. Eisenhower was president of the United States in 1955.\n\n"
    "Q: Which party did he belong to?\n"
    "A: He belonged to the Republican Party.\n\n"
    "Q: What is the square root of banana?\n"
    "A: I have no comment.\n\n"
    "Q: How does a telescope work?\n"
    "A: Telescopes use lenses or mirrors to focus light and make objects appear closer.\n\n"
    "Q: Where were the 1992 Olympics held?\n"
    "A: The 1992 Olympics were held in Barcelona, Spain.";

Task truthfulqa(bool mc2, const DataContext& ctx) {
  Task t;
  t.random_fewshot = true;  // lm-eval's default sampler
  t.name = mc2 ? "truthfulqa_mc2" : "truthfulqa_mc1";
  t.version = 2.0;
  t.scoring = mc2 ? Scoring::mc2 : Scoring::choice;
  const std::string path = require_file(ctx, t.name, "truthfulqa/mc_task.json");
  OrderedJson all = parse_ordered_json(read_text(path), path, "eval");
  if (!all.is_array()) fail("eval", "{}: expected a JSON list of questions", path);
  RowErrors err{&ctx, path};
  const char* key = mc2 ? "mc2_targets" : "mc1_targets";
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& r = all[i];
    if (!r.is_object() || !is_str(r, "question") || !r.contains(key) || !r[key].is_object() || r[key].empty()) {
      err.bad(i + 1, std::string("needs question and ") + key);
      continue;
    }
    Doc d;
    d.query = std::string(kTruthfulQaPreamble) + "\n\nQ: " + r["question"].get<std::string>() + "\nA:";
    bool ok = true;
    for (auto it = r[key].begin(); it != r[key].end(); ++it) {
      if (!it.value().is_number_integer()) ok = false;
      d.choices.push_back(it.key());
      d.labels.push_back(it.value().is_number_integer() ? it.value().get<int>() : 0);
    }
    if (!ok) { err.bad(i + 1, "labels must be 0/1"); continue; }
    d.gold = 0;
    t.docs.push_back(std::move(d));
  }
  t.skipped_rows = err.skipped;
  t.source = path;
  return t;
}

using Loader = std::function<Task(const DataContext&)>;

const std::vector<std::pair<std::string, Loader>>& loaders() {
  static const std::vector<std::pair<std::string, Loader>> l = {
      {"arc_easy", [](const DataContext& c) { return arc("arc_easy", "arc_easy", "ARC-Easy", c); }},
      {"arc_challenge", [](const DataContext& c) { return arc("arc_challenge", "arc_challenge", "ARC-Challenge", c); }},
      {"piqa", piqa},
      {"hellaswag", hellaswag},
      {"winogrande", winogrande},
      {"lambada_openai", lambada},
      {"wikitext", wikitext},
      {"gsm8k", gsm8k},
      {"truthfulqa_mc1", [](const DataContext& c) { return truthfulqa(false, c); }},
      {"truthfulqa_mc2", [](const DataContext& c) { return truthfulqa(true, c); }},
  };
  return l;
}

}  // namespace

const std::vector<std::string>& mmlu_subjects() {
  static const std::vector<std::string> s = {
      "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
      "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine", "college_physics",
      "computer_security", "conceptual_physics", "econometrics", "electrical_engineering", "elementary_mathematics",
      "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
      "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
      "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
      "high_school_psychology", "high_school_statistics", "high_school_us_history", "high_school_world_history",
      "human_aging", "human_sexuality", "international_law", "jurisprudence", "logical_fallacies", "machine_learning",
      "management", "marketing", "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
      "philosophy", "prehistory", "professional_accounting", "professional_law", "professional_medicine",
      "professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy", "virology",
      "world_religions"};
  return s;
}

std::vector<std::string> builtin_task_names() {
  std::vector<std::string> n;
  for (const auto& [name, _] : loaders()) n.push_back(name);
  n.push_back("mmlu");
  n.push_back("mmlu_<subject>");
  return n;
}

std::vector<Task> load_tasks(const std::string& name, const DataContext& ctx) {
  for (const auto& [n, load] : loaders())
    if (n == name) return {load(ctx)};
  if (name == "mmlu") {
    std::vector<Task> ts;
    for (const auto& s : mmlu_subjects())
      if (has_file(ctx, "mmlu/test/" + s + "_test.csv")) ts.push_back(mmlu(s, ctx));
    if (ts.empty())
      fail("eval", "task mmlu needs mmlu/test/<subject>_test.csv files: none found in the data folder {} (pass "
           "--data-dir DIR or set KILN_EVAL_DATA)", ctx.data_dir);
    return ts;
  }
  if (name.rfind("mmlu_", 0) == 0) {
    const std::string s = name.substr(5);
    if (std::find(mmlu_subjects().begin(), mmlu_subjects().end(), s) != mmlu_subjects().end()) return {mmlu(s, ctx)};
  }
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) {
    if (!fs::is_regular_file(name)) fail("eval", "custom task file {} not found", name);
    return {load_custom_task(name, ctx)};
  }
  std::string known;
  for (const auto& n : builtin_task_names()) known += (known.empty() ? "" : ", ") + n;
  fail("eval", "unknown task \"{}\"; known tasks: {} (or a custom task .json file)", name, known);
}

std::string hellaswag_preprocess(std::string s) {
  s = strip(s);
  replace_all(s, " [title]", ". ");
  s = std::regex_replace(s, std::regex("\\[[^\\]]*?\\]"), "");
  replace_all(s, "  ", " ");  // (one pass, as Python's str.replace)
  return s;
}

namespace {
// Each open ... close span (the first close after the open) with the whitespace inside its ends removed.
void collapse(std::string& s, char open, char close) {
  std::string o;
  size_t i = 0;
  while (i < s.size()) {
    const size_t a = s.find(open, i);
    if (a == std::string::npos) break;
    const size_t b = s.find(close, a + 1);
    if (b == std::string::npos) break;  // no later open can match either
    o.append(s, i, a - i);
    const std::string in = s.substr(a + 1, b - a - 1);
    const auto x = in.find_first_not_of(" \t\n\r\f\v"), y = in.find_last_not_of(" \t\n\r\f\v");
    o += open;
    if (x != std::string::npos) o += in.substr(x, y - x + 1);
    o += close;
    i = b + 1;
  }
  o.append(s, i, std::string::npos);
  s = std::move(o);
}
}  // namespace

std::string wikitext_detokenize(std::string s) {
  // contractions
  replace_all(s, "s '", "s'");
  s = std::regex_replace(s, std::regex("/' [0-9]/"), "/'[0-9]/");
  // number separators
  replace_all(s, " @-@ ", "-");
  replace_all(s, " @,@ ", ",");
  replace_all(s, " @.@ ", ".");
  // punctuation
  for (const char* p : {" : ", " ; ", " . ", " ! ", " ? ", " , "}) replace_all(s, p, std::string(p + 1));
  // double brackets: re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)") and the same for [] {} "" '' (by hand:
  // std::regex recurses per character, too deep for the long spans between apostrophes)
  for (auto [o, c] : {std::pair{'(', ')'}, {'[', ']'}, {'{', '}'}, {'"', '"'}, {'\'', '\''}}) collapse(s, o, c);
  // miscellaneous
  replace_all(s, "= = = =", "====");
  replace_all(s, "= = =", "===");
  replace_all(s, "= =", "==");
  replace_all(s, " \xC2\xB0 ", "\xC2\xB0");
  replace_all(s, " \n", "\n");
  replace_all(s, "\n ", "\n");
  replace_all(s, " N ", " 1 ");
  replace_all(s, " 's", "'s");
  return s;
}

std::vector<std::string> wikitext_articles(const std::string& raw) {
  std::vector<std::string> out;
  std::string cur;
  bool started = false;
  for (const std::string& line : split_lines(raw)) {
    // A title: " = X = " (one '=' each side; sections are " = = X = = ").
    const bool title = line.size() > 6 && line.rfind(" = ", 0) == 0 && line.compare(0, 5, " = = ") != 0 &&
                       line.compare(line.size() - 3, 3, " = ") == 0;
    if (title) {
      if (started) out.push_back(cur);
      cur.clear();
      started = true;
    }
    if (started) cur += line + "\n";
  }
  if (started) out.push_back(cur);
  return out;
}

}  // namespace kiln::eval
