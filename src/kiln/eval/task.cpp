// Prompt building (task.h): lm-eval's ContextSampler.get_context with the first_n sampler, and its
// chat form (fewshot_context with apply_chat_template).
#include "kiln/eval/task.h"

#include <algorithm>

namespace kiln::eval {

std::string example_target(const Task& t, const Doc& d) {
  if (t.output_type == OutputType::multiple_choice && !d.choices.empty() && d.contexts.empty())
    return d.choices[static_cast<size_t>(d.gold)];
  return d.target;
}

namespace {

std::string query_of(const Doc& d, size_t context) { return d.contexts.empty() ? d.query : d.contexts[context]; }

// The few-shot examples for d: lm-eval's ContextSampler.get_context (rng.sample of n docs, n + 1
// when they come from the evaluated split, then d left out), or the first n (first_n; skipping d).
std::vector<const Doc*> examples(const Task& t, const Doc& d, int n, PyRandom* rng) {
  std::vector<const Doc*> ex;
  if (n <= 0) return ex;
  const auto& pool = t.fewshot_docs.empty() ? t.docs : t.fewshot_docs;
  if (t.random_fewshot && rng) {
    const size_t want = std::min(pool.size(), static_cast<size_t>(n) + (t.fewshot_docs.empty() ? 1 : 0));
    for (size_t i : rng->sample(pool.size(), want))
      if (&pool[i] != &d && static_cast<int>(ex.size()) < n) ex.push_back(&pool[i]);
    return ex;
  }
  for (const Doc& e : pool) {
    if (static_cast<int>(ex.size()) >= n) break;
    if (&e == &d) continue;
    ex.push_back(&e);
  }
  return ex;
}

}  // namespace

std::vector<std::string> contexts(const Task& t, const Doc& d, const PromptOptions& opt) {
  const int shots = opt.shots >= 0 ? opt.shots : t.default_shots;
  const auto ex = examples(t, d, shots, opt.rng);
  const size_t n_ctx = d.contexts.empty() ? 1 : d.contexts.size();
  std::vector<std::string> out;
  for (size_t c = 0; c < n_ctx; ++c) {
    if (!opt.chat) {
      std::string s = t.description;
      for (const Doc* e : ex) s += query_of(*e, static_cast<size_t>(e->gold)) + t.target_delimiter + example_target(t, *e) + t.fewshot_delimiter;
      s += query_of(d, c);
      out.push_back(std::move(s));
      continue;
    }
    OrderedJson msgs = OrderedJson::array();
    if (!t.description.empty()) msgs.push_back({{"role", "system"}, {"content", t.description}});
    std::string user;
    for (const Doc* e : ex) {
      const std::string q = query_of(*e, static_cast<size_t>(e->gold)), a = example_target(t, *e);
      if (opt.fewshot_as_multiturn) {
        msgs.push_back({{"role", "user"}, {"content", q}});
        msgs.push_back({{"role", "assistant"}, {"content", a}});
      } else {
        user += q + t.target_delimiter + a + t.fewshot_delimiter;
      }
    }
    user += query_of(d, c);
    msgs.push_back({{"role", "user"}, {"content", user}});
    out.push_back(opt.chat(msgs));
  }
  return out;
}

}  // namespace kiln::eval
