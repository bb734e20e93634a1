// The task registry: lm-evaluation-harness's tasks that kiln defines itself (same prompts, targets,
// answer rules and metrics; builtin_tasks.cpp), MMLU per subject, and custom tasks from JSON files.
#pragma once
#include <string>
#include <vector>

#include "kiln/eval/datasets.h"
#include "kiln/eval/task.h"

namespace kiln::eval {

// Names `--tasks` accepts: the built-in tasks, "mmlu" (every subject with data) and mmlu_<subject>.
std::vector<std::string> builtin_task_names();
const std::vector<std::string>& mmlu_subjects();

// The tasks `name` stands for: a built-in name, "mmlu" (one task per subject whose test file is in
// the data folder), mmlu_<subject>, or a path to a custom task JSON file (custom_task.h). Throws
// [eval] for an unknown name, listing the known ones, and for missing data files.
std::vector<Task> load_tasks(const std::string& name, const DataContext& ctx);

// lm-eval's wikitext_detokenizer (the wikitext task's doc_to_target).
std::string wikitext_detokenize(std::string s);
// The WikiText-2 raw text cut into articles at their " = Title = " lines (EleutherAI/wikitext_document_level).
std::vector<std::string> wikitext_articles(const std::string& raw);
// lm-eval's hellaswag preprocess: strip, " [title]" -> ". ", drop [tags], collapse double spaces.
std::string hellaswag_preprocess(std::string s);

}  // namespace kiln::eval
