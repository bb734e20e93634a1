// A custom task from a small JSON file, lm-eval's YAML task in miniature:
//   {"name": "capitals", "dataset": "capitals.jsonl", "output_type": "multiple_choice",
//    "doc_to_text": "Q: {{question}}\nA:", "doc_to_choice": "{{options}}", "doc_to_target": "{{answer}}",
//    "metric": "acc", "num_fewshot": 0, "description": "", "target_delimiter": " ",
//    "fewshot_delimiter": "\n\n", "until": ["\n"], "max_gen_toks": 64}
// dataset: a JSONL file, relative to the JSON file's folder. {{a.b}} is the row's field a.b (strings
// as they are, other values as JSON). output_type: multiple_choice (metric acc / acc_norm; the
// target is a choice index or a choice's text; doc_to_choice is a field holding a list or a list of
// templates), generate_until (metric exact_match), loglikelihood (metric acc: the target is the greedy
// continuation; also perplexity), loglikelihood_rolling (the text is the document: word/byte perplexity).
#pragma once
#include <string>

#include "kiln/eval/datasets.h"
#include "kiln/eval/task.h"

namespace kiln::eval {

Task load_custom_task(const std::string& json_path, const DataContext& ctx);
// A template's text for one row ({{field}} and {{field.sub}} replaced).
std::string render_template(const std::string& tmpl, const OrderedJson& row, const std::string& where);

}  // namespace kiln::eval
