// Running a task on a model, as lm-evaluation-harness's evaluator does: the docs (first --limit),
// their requests (context and continuation text -> token ids, lm-eval's _encode_pair), the
// model's answers (loglikelihood.h, generate_until.h), per-doc scores, then metrics with standard
// errors; and the results JSON in lm-eval's shape (results, versions, n-shot, n-samples, config).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/engine/loader.h"
#include "kiln/eval/generate_until.h"
#include "kiln/eval/loglikelihood.h"
#include "kiln/eval/task.h"

namespace kiln::eval {

struct HarnessOptions {
  PromptOptions prompt;
  double limit = -1;         // < 0: all docs; < 1: that fraction; else that many (lm-eval's --limit)
  int batch_size = 16;
  bool group_prefixes = true;
  int max_length = 0;        // the model's context (0: max_position_embeddings)
  int max_gen_toks = 0;      // --max-tokens: overrides the task's max_gen_toks when > 0
  engine::SamplingParams sampling;
  // Prompts go through the chat template (it writes its own special tokens): encode without them.
  bool add_special_tokens = true;
  bool log_samples = false;  // keep every doc's requests and answers in TaskResult::samples
  // (task, requests done, requests total) as the model answers.
  std::function<void(const std::string&, size_t, size_t)> progress;
};

struct MetricValue {
  std::string name, filter = "none";
  double value = 0;
  bool has_stderr = false;
  double stderr_ = 0;
};

struct TaskResult {
  std::string name, group;
  double version = 1.0;
  int shots = 0;
  size_t n_docs = 0, n_original = 0, n_requests = 0, skipped_rows = 0;
  double seconds = 0;
  std::vector<MetricValue> metrics;
  std::vector<double> primary_scores;  // per doc, of the first metric (groups aggregate these)
  // With log_samples, one object per doc as lm-eval's --log_samples writes them: doc_id, target,
  // arguments (the requests' text), resps (the answers); loglikelihood requests also give token_ids
  // ([context ids, continuation ids] per request).
  OrderedJson samples = OrderedJson::array();
};

// lm-eval's _encode_pair: trailing spaces of the context move to the continuation; the continuation's
// ids are encode(context + continuation) past encode(context)'s; an empty context becomes the prefix
// token (BOS, else EOS). Returns the request.
LoglikelihoodRequest encode_pair(const tokenizer::Tokenizer& tok, std::string context, std::string continuation,
                                 bool add_special_tokens);
// The number of docs --limit keeps of n.
size_t limited(size_t n, double limit);

TaskResult run_task(const Task& t, engine::LoadedModel& m, const HarnessOptions& opt);

// A group's result (MMLU): acc over all its tasks' docs.
TaskResult aggregate_group(const std::string& name, const std::vector<TaskResult>& members);

// {"results": {task: {"alias", "<metric>,<filter>", "<metric>_stderr,<filter>"}}, "versions",
//  "n-shot", "n-samples": {task: {"original", "effective"}}, "config": config}
OrderedJson results_json(const std::vector<TaskResult>& results, const OrderedJson& config);

}  // namespace kiln::eval
