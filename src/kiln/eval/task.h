// An evaluation task as lm-evaluation-harness's ConfigurableTask defines one, reduced to what its
// built-in tasks use: documents already rendered to text (doc_to_text -> query, doc_to_choice ->
// choices, doc_to_target -> gold / target), the few-shot documents, the delimiters and the
// description, the request type and how its results become metrics. The built-in tasks
// (builtin_tasks.cpp) and custom JSON tasks (custom_task.cpp) build these; the harness runs them.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/eval/py_random.h"

namespace kiln::eval {

enum class OutputType { multiple_choice, loglikelihood, loglikelihood_rolling, generate_until };

// How a document's results become metrics.
enum class Scoring {
  choice,    // acc (and acc_norm when Task::acc_norm): the choice with the highest loglikelihood
  mc2,       // TruthfulQA mc2: the true answers' probability mass
  lambada,   // loglikelihood of the target: perplexity and acc (is_greedy)
  rolling,   // word_perplexity, byte_perplexity, bits_per_byte of the document
  gsm8k,     // exact_match under strict-match ("#### N") and flexible-extract (the last number)
  exact,     // exact_match of the stripped generation against the target
};

struct Doc {
  std::string query;                  // doc_to_text
  std::vector<std::string> contexts;  // one query per choice instead (WinoGrande's partial scoring)
  std::vector<std::string> choices;   // doc_to_choice
  int gold = 0;                       // doc_to_target as a choice index
  std::vector<int> labels;            // mc2: 1/0 per choice
  std::string target;                 // doc_to_target as text (loglikelihood, generate_until, rolling)
  std::string original;               // rolling: the document before detokenization (word/byte counts)
};

struct Task {
  std::string name, group;  // group: "mmlu" for the mmlu_<subject> tasks
  double version = 1.0;
  OutputType output_type = OutputType::multiple_choice;
  Scoring scoring = Scoring::choice;
  bool acc_norm = false;
  std::string description;  // before the few-shot examples (MMLU's subject line)
  std::string target_delimiter = " ", fewshot_delimiter = "\n\n";
  int default_shots = 0;
  std::vector<Doc> docs;          // the evaluated split, in file order
  std::vector<Doc> fewshot_docs;  // the examples' split (empty: the evaluated docs, never the doc itself)
  // lm-eval's default sampler (random.Random(1234).sample per doc, in doc order) rather than its
  // first_n sampler (MMLU, GSM8K).
  bool random_fewshot = false;
  std::vector<std::string> until;  // generate_until's stop strings
  int max_gen_toks = 256;
  size_t skipped_rows = 0;         // malformed rows left out while loading
  std::string source;              // the data file(s) read
};

// Messages (OpenAI shape) -> prompt text, when prompts go through the model's chat template.
using ChatRenderer = std::function<std::string(const OrderedJson& messages)>;

struct PromptOptions {
  int shots = -1;  // -1: the task's default_shots
  bool fewshot_as_multiturn = false;
  ChatRenderer chat;  // empty: plain text prompts
  // The generator of a random_fewshot task's draws, one per doc in order (the harness seeds it
  // with lm-eval's 1234 per task); null: the first examples.
  PyRandom* rng = nullptr;
};

// The text of doc's context(s) as lm-eval builds them: description, then `shots` few-shot
// examples (drawn by opt.rng for a random_fewshot task, else the first ones) (query + target_delimiter + target, each followed by fewshot_delimiter), then
// the query; one per Doc::contexts entry when it has them. With a chat renderer: the description as
// the system message, the examples and query as one user message (or as user/assistant turns under
// fewshot_as_multiturn), rendered with the generation prompt.
std::vector<std::string> contexts(const Task& t, const Doc& d, const PromptOptions& opt);

// What a few-shot example contributes as the answer: the gold choice, or the target.
std::string example_target(const Task& t, const Doc& d);

}  // namespace kiln::eval
