// kiln evaluate's core against oracles: per-request loglikelihoods on stories260K and two tiny
// models equal the sums of log-softmax values of reference.json's logits (the transformers
// forward), prefix-grouped scoring equals ungrouped, lm-eval's rolling windows cover every token
// once, the metric rules (acc_norm by length, mc2, GSM8K's filters and exact_match, stderr) on
// hand-computed cases, the first items' prompts of every built-in task equal lm-eval's templates
// applied by hand to the fixture rows, and every built-in task runs on stories260K.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "../model_test_util.h"
#include "kiln/base/json.h"
#include "kiln/engine/loader.h"
#include "kiln/eval/harness.h"
#include "kiln/eval/metrics.h"
#include "kiln/eval/perplexity.h"
#include "kiln/eval/tasks.h"

using namespace kiln;

namespace {

const std::string kShared = KILN_SHARED_DIR;
const std::string kFixtures = kShared + "/fixtures/eval";

// sum over p in [k - 1, n - 1) of log_softmax(logits[p])[ids[p + 1]] (the continuation ids[k, n)).
double reference_ll(const Json& logits, const std::vector<int32_t>& ids, size_t k, size_t n) {
  double s = 0;
  std::vector<float> row;
  std::vector<double> lp;
  for (size_t p = k - 1; p + 1 < n; ++p) {
    row = logits[p].get<std::vector<float>>();
    eval::log_softmax(row.data(), static_cast<int64_t>(row.size()), lp);
    s += lp[ids[p + 1]];
  }
  return s;
}

void check_reference(const std::string& name, const char* ids_key, const char* logits_key) {
  const std::string dir = kShared + "/models/" + name;
  const Json ref = read_json_file(dir + "/reference.json");
  auto l = test::load_model_dir(dir);
  const auto ids = ref[ids_key].get<std::vector<int32_t>>();
  const size_t n = ids.size();
  ASSERT_GE(n, 3u);
  // Contexts of several lengths (across the 16-token block edge where the prompt is that long),
  // and one context with many continuations (a group; past 16 tokens it shares its first block).
  std::vector<eval::LoglikelihoodRequest> reqs;
  std::vector<std::pair<size_t, size_t>> spans;  // (k, end)
  for (size_t k : {size_t(1), size_t(2), size_t(5), size_t(16), size_t(17), n - 1}) {
    if (k >= n) continue;
    reqs.push_back({{ids.begin(), ids.begin() + k}, {ids.begin() + k, ids.end()}});
    spans.emplace_back(k, n);
  }
  const size_t g = n > 24 ? 20 : n / 2;
  for (size_t e = g + 1; e <= n; ++e) {
    reqs.push_back({{ids.begin(), ids.begin() + g}, {ids.begin() + g, ids.begin() + e}});
    spans.emplace_back(g, e);
  }
  eval::ScoreOptions grouped, single;
  grouped.batch_size = 4;
  single.group_prefixes = false;
  single.batch_size = 1;
  const auto a = eval::loglikelihood(*l->m, reqs, grouped);
  const auto b = eval::loglikelihood(*l->m, reqs, single);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const double want = reference_ll(ref[logits_key], ids, spans[i].first, spans[i].second);
    EXPECT_NEAR(a[i].logprob, want, 1e-4) << name << " request " << i;
    EXPECT_NEAR(b[i].logprob, want, 1e-4) << name << " request " << i << " (ungrouped)";
    EXPECT_NEAR(a[i].logprob, b[i].logprob, 1e-4) << name << " grouped vs ungrouped, request " << i;
    EXPECT_EQ(a[i].is_greedy, b[i].is_greedy);
  }
}

eval::DataContext fixtures() { return {kFixtures, false}; }

eval::Task one(const std::string& name) {
  auto ts = eval::load_tasks(name, fixtures());
  EXPECT_EQ(ts.size(), 1u);
  return ts.at(0);
}

}  // namespace

TEST(EvalLoglikelihood, Stories260KEqualsReferenceLogits) { check_reference("stories260K", "prompt_ids", "prompt_logits"); }
TEST(EvalLoglikelihood, TinyLlamaEqualsReferenceLogits) { check_reference("tiny-llama", "input_ids", "logits"); }
TEST(EvalLoglikelihood, TinyQwen2EqualsReferenceLogits) { check_reference("tiny-qwen2", "input_ids", "logits"); }

TEST(EvalLoglikelihood, GreedyAndTruncation) {
  auto l = test::load_model_dir(kShared + "/models/tiny-llama");
  const Json ref = read_json_file(kShared + "/models/tiny-llama/reference.json");
  const auto ids = ref["input_ids"].get<std::vector<int32_t>>();
  const int vocab = l->cfg.vocab_size;
  // The argmax of position 3 as continuation is greedy; another token is not.
  std::vector<int32_t> ctx(ids.begin(), ids.begin() + 4);
  auto row = ref["logits"][3].get<std::vector<float>>();
  const int32_t best = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  std::vector<eval::LoglikelihoodRequest> reqs = {{ctx, {best}}, {ctx, {(best + 1) % vocab}}};
  auto r = eval::loglikelihood(*l->m, reqs);
  EXPECT_TRUE(r[0].is_greedy);
  EXPECT_FALSE(r[1].is_greedy);
  // max_length 8: the context loses tokens from the left; equal to scoring the kept tokens.
  eval::ScoreOptions o;
  o.max_length = 8;
  std::vector<eval::LoglikelihoodRequest> longr = {{{ids.begin(), ids.begin() + 12}, {ids.begin() + 12, ids.begin() + 14}}};
  std::vector<eval::LoglikelihoodRequest> kept = {{{ids.begin() + 5, ids.begin() + 12}, {ids.begin() + 12, ids.begin() + 14}}};
  EXPECT_NEAR(eval::loglikelihood(*l->m, longr, o)[0].logprob, eval::loglikelihood(*l->m, kept)[0].logprob, 1e-5);
  EXPECT_THROW(eval::loglikelihood(*l->m, std::vector<eval::LoglikelihoodRequest>{{{}, {1}}}), Error);
  EXPECT_THROW(eval::loglikelihood(*l->m, std::vector<eval::LoglikelihoodRequest>{{{1}, {99999}}}), Error);
}

TEST(EvalRolling, WindowsCoverEveryTokenOnce) {
  std::vector<int32_t> t(10);
  std::iota(t.begin(), t.end(), 100);
  const auto w = eval::rolling_windows(t, 1, 4);
  ASSERT_EQ(w.size(), 3u);
  // lm-eval: ([P], t[0:4]), then (t[3:4], t[4:8]), then the last window t[5:9] -> (t[5:8], t[8:10]).
  EXPECT_EQ(w[0].context, std::vector<int32_t>({1}));
  EXPECT_EQ(w[0].continuation, std::vector<int32_t>({100, 101, 102, 103}));
  EXPECT_EQ(w[1].context, std::vector<int32_t>({103}));
  EXPECT_EQ(w[1].continuation, std::vector<int32_t>({104, 105, 106, 107}));
  EXPECT_EQ(w[2].context, std::vector<int32_t>({105, 106, 107}));
  EXPECT_EQ(w[2].continuation, std::vector<int32_t>({108, 109}));
  EXPECT_EQ(eval::rolling_windows(t, 1, 16).size(), 1u);
  EXPECT_TRUE(eval::rolling_windows({}, 1, 4).empty());
  // Scored: the windows' sum equals one request over the whole document when it fits.
  auto l = test::load_model_dir(kShared + "/models/tiny-llama");
  const Json ref = read_json_file(kShared + "/models/tiny-llama/reference.json");
  const auto ids = ref["input_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> doc(ids.begin() + 1, ids.end());
  double whole = eval::loglikelihood(*l->m, eval::rolling_windows(doc, ids[0], 64))[0].logprob;
  EXPECT_NEAR(whole, reference_ll(ref["logits"], ids, 1, ids.size()), 1e-4);
  double sum = 0;
  for (auto& r : eval::loglikelihood(*l->m, eval::rolling_windows(doc, ids[0], 8))) sum += r.logprob;
  EXPECT_LT(sum, 0.0);  // (shorter windows see less context: a different, finite number)
  EXPECT_TRUE(std::isfinite(sum));
}

TEST(EvalMetrics, LmEvalRules) {
  const std::vector<double> x = {1, 0, 1, 1};
  const auto e = eval::mean_stderr(x);
  EXPECT_NEAR(e.value, 0.75, 1e-12);
  EXPECT_NEAR(e.stderr_, std::sqrt(0.25 / 4), 1e-12);  // sample var (ddof 1) = 0.25
  // acc_norm divides by the choice's length in characters: -6/3 > -4/1.
  const std::vector<double> lls = {-4.0, -6.0};
  const std::vector<std::string> ch = {"a", "abc"};
  EXPECT_EQ(eval::argmax(lls), 0u);
  EXPECT_EQ(eval::argmax_normalized(lls, ch), 1u);
  EXPECT_EQ(eval::utf8_length("caf\xC3\xA9"), 4u);
  // mc2: true mass 0.5 + 0.25 over 1.0.
  const std::vector<double> l2 = {std::log(0.5), std::log(0.25), std::log(0.25)};
  const std::vector<int> lab = {1, 1, 0};
  EXPECT_NEAR(eval::mc2_score(l2, lab), 0.75, 1e-12);
  // GSM8K: strict-match takes "#### N"; flexible-extract the last number; targets lose "...#### ".
  const std::vector<std::string> ign = {",", "\\$", "(?s).*#### ", "\\.$"};
  const std::string target = "She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18";
  EXPECT_EQ(eval::regex_extract("so #### 18\n", "#### (\\-?[0-9\\.\\,]+)", 0), "18");
  EXPECT_EQ(eval::regex_extract("no marker", "#### (\\-?[0-9\\.\\,]+)", 0), "[invalid]");
  EXPECT_EQ(eval::regex_extract("3 eggs, then $1,018.", "(-?[$0-9.,]{2,})|(-?[0-9]+)", -1), "$1,018.");
  EXPECT_TRUE(eval::exact_match("18", target, ign, true));
  EXPECT_TRUE(eval::exact_match("$1,8.", "#### 18", ign, true));
  EXPECT_FALSE(eval::exact_match("17", target, ign, true));
  EXPECT_NEAR(eval::bits_per_byte(std::vector<double>{-std::log(2.0) * 8}, std::vector<double>{4}), 2.0, 1e-12);
  EXPECT_NEAR(eval::weighted_perplexity(std::vector<double>{-2.0}, std::vector<double>{2}), std::exp(1.0), 1e-12);
}

// The first item of each task, written out by hand from lm-eval's task YAMLs and the fixture rows.
TEST(EvalTasks, FirstPromptsMatchLmEvalTemplates) {
  eval::PromptOptions p;
  {
    auto t = one("arc_easy");
    EXPECT_EQ(t.docs.size(), 2376u);
    EXPECT_EQ(eval::contexts(t, t.docs[0], p)[0],
              "Question: Which statement best explains why photosynthesis is the foundation of most food webs?\nAnswer:");
    EXPECT_EQ(t.docs[0].choices[0], "Sunlight is the source of energy for nearly all ecosystems.");
    EXPECT_EQ(t.docs[0].gold, 0);  // answerKey A
    EXPECT_TRUE(t.acc_norm);
    EXPECT_EQ(t.target_delimiter, " ");
  }
  EXPECT_EQ(one("arc_challenge").docs.size(), 1172u);
  {
    auto t = one("piqa");
    EXPECT_EQ(eval::contexts(t, t.docs[0], p)[0], "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:");
    EXPECT_EQ(t.docs[0].choices.size(), 2u);
    EXPECT_EQ(t.docs[0].gold, 0);
    EXPECT_EQ(t.docs[1].gold, 1);
  }
  {
    auto t = one("winogrande");
    const auto c = eval::contexts(t, t.docs[0], p);
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(c[0], "Sarah was a much better surgeon than Maria so Sarah");
    EXPECT_EQ(c[1], "Sarah was a much better surgeon than Maria so Maria");
    EXPECT_EQ(t.docs[0].target, "always got the easier cases.");
    EXPECT_EQ(t.docs[0].gold, 1);
  }
  {
    auto t = one("hellaswag");
    EXPECT_EQ(t.docs.size(), 10042u);
    EXPECT_EQ(eval::contexts(t, t.docs[0], p)[0], "Roof shingle removal: A man is sitting on a roof. he");
    EXPECT_EQ(t.docs[0].choices[3], "starts pulling up roofing on a roof.");
    EXPECT_EQ(t.docs[0].gold, 3);
    // strip; " [title]" -> ". " ("x.  Do"); tags removed; "  " -> " " in one pass (3 spaces -> 2).
    EXPECT_EQ(eval::hellaswag_preprocess(" [header] How to x [title] Do y.  [step] Z "), " How to x. Do y.  Z");
  }
  {
    auto t = one("lambada_openai");
    EXPECT_EQ(t.docs.size(), 5153u);
    EXPECT_EQ(t.target_delimiter, "");
    EXPECT_EQ(t.docs[0].target, " signs");
    const std::string q = eval::contexts(t, t.docs[0], p)[0];
    EXPECT_EQ(q.substr(q.size() - 30), "ident grin, I don't care about");
    EXPECT_EQ(q.substr(0, 32), "In my palm is a clear stone, and");
  }
  {
    auto t = one("gsm8k");
    EXPECT_EQ(t.default_shots, 5);
    const std::string c = eval::contexts(t, t.docs[0], p)[0];
    const std::string first_shot =
        "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How "
        "many clips did Natalia sell altogether in April and May?\nAnswer: Natalia sold 48/2 = <<48/2=24>>24 clips in "
        "May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72\n\nQuestion: ";
    EXPECT_EQ(c.substr(0, first_shot.size()), first_shot);
    EXPECT_EQ(c.substr(c.size() - 8), "\nAnswer:");
    EXPECT_NE(c.find("\n\nQuestion: Janet\xE2\x80\x99s ducks lay 16 eggs per day."), std::string::npos);
    EXPECT_EQ(t.until, (std::vector<std::string>{"Question:", "</s>", "<|im_end|>"}));
  }
  {
    auto t = one("mmlu_marketing");
    EXPECT_EQ(t.docs.size(), 234u);
    const std::string c = eval::contexts(t, t.docs[0], p)[0];
    const std::string head =
        "The following are multiple choice questions (with answers) about marketing.\n\n"
        "_____________ is a natural outcome when combining demographic and geographic variables.\nA. Geodemographics\n"
        "B. Product differentiation.\nC. ANSOFF matrix.\nD. Brand management.\nAnswer: A\n\n"
        "In an organization, the group of people tasked with buying decisions is referred to as the _______________.\n"
        "A. Outsourcing unit.\nB. Procurement centre.\nC. Chief executive unit.\nD. Decision-making unit.\nAnswer: D\n\n";
    EXPECT_EQ(c.substr(0, head.size()), head);
    EXPECT_EQ(c.substr(c.size() - 8), "\nAnswer:");
    EXPECT_EQ(t.docs[0].choices, (std::vector<std::string>{"A", "B", "C", "D"}));
    EXPECT_EQ(eval::load_tasks("mmlu", fixtures()).size(), 8u);  // the subjects with a test file
  }
  {
    auto t = one("truthfulqa_mc1");
    const std::string c = eval::contexts(t, t.docs[0], p)[0];
    EXPECT_EQ(c.substr(0, 100), std::string("Q: What is human life expectancy in the United States?\nA: Human life "
                                            "expectancy in the United States is 78 years.\n\nQ: Who").substr(0, 100));
    const std::string tail = "A: The 1992 Olympics were held in Barcelona, Spain.\n\nQ: What is the smallest country in "
                             "the world that is at least one square mile in area?\nA:";
    EXPECT_EQ(c.substr(c.size() - tail.size()), tail);
    EXPECT_EQ(t.docs[0].choices[0], "Nauru is the smallest country in the world that is at least one square mile in area.");
    EXPECT_EQ(t.docs[0].gold, 0);
    auto t2 = one("truthfulqa_mc2");
    EXPECT_EQ(t2.docs[0].labels.front(), 1);
    EXPECT_EQ(t2.docs[0].labels.back(), 0);
  }
  {
    auto t = one("wikitext");
    EXPECT_EQ(t.docs.size(), 62u);  // wikitext_document_level's wikitext-2-raw-v1 test split
    const std::string want = " = Robert Boulter =\n\nRobert Boulter is an English film, television and theatre actor. "
                             "He had a guest-starring role";
    EXPECT_EQ(t.docs[0].target.substr(0, want.size()), want);
    EXPECT_EQ(t.docs[0].original.substr(0, 22), " = Robert Boulter = \n ");
    EXPECT_EQ(eval::wikitext_detokenize("a ( b c ) \" d \" 1 @,@ 000 s ' x"), "a (b c) \"d\" 1,000 s' x");
  }
}

// CPython 3.11's random.Random(1234): getrandbits(32) x3, then sample() by both of its methods
// (pool: n <= setsize; set: n larger), the numbers printed by CPython itself.
TEST(EvalFewshot, PyRandomEqualsCPython) {
  eval::PyRandom r(1234);
  EXPECT_EQ(r.next_u32(), 4150886329u);
  EXPECT_EQ(r.next_u32(), 3342196574u);
  EXPECT_EQ(r.next_u32(), 1892932127u);
  eval::PyRandom s(1234);
  EXPECT_EQ(s.sample(2251, 5), (std::vector<size_t>{1805, 478, 30, 371, 143}));
  EXPECT_EQ(s.sample(2251, 5), (std::vector<size_t>{343, 403, 1452, 969, 71}));
  EXPECT_EQ(s.sample(10, 3), (std::vector<size_t>{0, 9, 5}));
  EXPECT_EQ(s.sample(30, 6), (std::vector<size_t>{20, 19, 15, 28, 14, 4}));
}

// lm-eval's default sampler: arc_easy 1-shot draws train docs 1805 then 478 (random.Random(1234)
// shared across the docs in order), so doc 0's example is "Which of these resources will most
// likely be depleted first?" and doc 1's "Which action is an example of good water management?".
TEST(EvalFewshot, ArcDrawsAsLmEval) {
  auto t = one("arc_easy");
  eval::PyRandom rng(1234);
  eval::PromptOptions p;
  p.shots = 1;
  p.rng = &rng;
  const std::string c0 = eval::contexts(t, t.docs[0], p)[0], c1 = eval::contexts(t, t.docs[1], p)[0];
  EXPECT_EQ(c0.rfind("Question: Which of these resources will most likely be depleted first?\nAnswer: ", 0), 0u) << c0;
  EXPECT_EQ(c1.rfind("Question: Which action is an example of good water management?\nAnswer: ", 0), 0u) << c1;
  EXPECT_EQ(c0.substr(c0.size() - t.docs[0].query.size()), t.docs[0].query);
  // From the evaluated split (winogrande here, no train file): n + 1 drawn, the doc itself left
  // out: CPython's Random(1234).sample(range(1267), 4) = [902, 239, 15, 185] -> 902, 239, 15.
  auto w = one("winogrande");
  eval::PyRandom wr(1234);
  p.shots = 3;
  p.rng = &wr;
  auto shot = [&](size_t i) { return w.docs[i].contexts[w.docs[i].gold] + " " + w.docs[i].target + "\n\n"; };
  EXPECT_EQ(eval::contexts(w, w.docs[0], p)[0], shot(902) + shot(239) + shot(15) + w.docs[0].contexts[0]);
}

TEST(EvalTasks, PromptsWithShotsAndChat) {
  auto t = one("arc_easy");
  eval::PromptOptions p;
  p.shots = 1;  // (no generator: the first examples)
  // One example from the train split: its query, " ", its gold answer text, "\n\n".
  const std::string c = eval::contexts(t, t.docs[0], p)[0];
  const std::string ex = t.fewshot_docs[0].query + " " + t.fewshot_docs[0].choices[t.fewshot_docs[0].gold] + "\n\n";
  EXPECT_EQ(c, ex + t.docs[0].query);
  p.chat = [](const OrderedJson& m) { return m.dump(); };
  p.fewshot_as_multiturn = true;
  const OrderedJson msgs = OrderedJson::parse(eval::contexts(t, t.docs[0], p)[0]);
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(msgs[0]["role"], "user");
  EXPECT_EQ(msgs[1]["role"], "assistant");
  EXPECT_EQ(msgs[2]["content"], t.docs[0].query);
}

TEST(EvalTasks, EncodePairMovesTrailingSpaces) {
  auto m = engine::load_model(kShared + "/models/stories260K");
  const auto& tok = *m->tokenizer;
  const auto r = eval::encode_pair(tok, "Once upon a time ", "there", true);
  const auto whole = tok.encode("Once upon a time there", true);
  const auto ctx = tok.encode("Once upon a time", true);
  EXPECT_EQ(r.context, ctx);
  EXPECT_EQ(r.continuation, std::vector<int32_t>(whole.begin() + ctx.size(), whole.end()));
  const auto e = eval::encode_pair(tok, "", "hi", true);
  EXPECT_EQ(e.context, std::vector<int32_t>({*tok.bos_id()}));
}

TEST(EvalTasks, BadInput) {
  try {
    eval::load_tasks("hellaswagg", fixtures());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown task \"hellaswagg\""), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("arc_easy"), std::string::npos);
  }
  try {
    eval::load_tasks("piqa", {"/nonexistent/data", false});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("piqa/valid.jsonl"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/data"), std::string::npos);
  }
}

TEST(EvalTasks, CustomTaskAndMalformedRows) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kiln_eval_custom_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "caps.jsonl") << "{\"q\": \"France\", \"opts\": [\"Paris\", \"Rome\"], \"a\": 0}\n"
                                    << "not json\n"
                                    << "{\"q\": \"Italy\", \"opts\": [\"Paris\", \"Rome\"], \"a\": \"Rome\"}\n";
  std::ofstream(dir / "caps.json") << R"({"name": "caps", "dataset": "caps.jsonl", "output_type": "multiple_choice",
    "doc_to_text": "The capital of {{q}} is", "doc_to_choice": "{{opts}}", "doc_to_target": "{{a}}", "metric": "acc_norm"})";
  auto ts = eval::load_tasks((dir / "caps.json").string(), fixtures());
  ASSERT_EQ(ts.size(), 1u);
  const auto& t = ts[0];
  EXPECT_EQ(t.name, "caps");
  ASSERT_EQ(t.docs.size(), 2u);
  EXPECT_EQ(t.skipped_rows, 1u);
  EXPECT_EQ(eval::contexts(t, t.docs[0], {})[0], "The capital of France is");
  EXPECT_EQ(t.docs[1].gold, 1);
  EXPECT_TRUE(t.acc_norm);
  EXPECT_THROW(eval::load_tasks((dir / "caps.json").string(), {kFixtures, true}), Error);  // --strict
  auto m = engine::load_model(kShared + "/models/stories260K");
  const auto r = eval::run_task(t, *m, {});
  EXPECT_EQ(r.n_requests, 4u);
  fs::remove_all(dir);
}

// Every built-in task on stories260K (near-chance numbers; what is checked is that each runs to
// metrics in range). Limits keep the label short on 2 cores: 200 docs where a task is fast.
TEST(EvalTasks, EveryBuiltinRunsOnStories260K) {
  auto m = engine::load_model(kShared + "/models/stories260K");
  const std::vector<std::pair<std::string, double>> runs = {
      {"arc_easy", 200}, {"arc_challenge", 200}, {"piqa", 200}, {"winogrande", 200}, {"lambada_openai", 200},
      {"hellaswag", 40}, {"truthfulqa_mc1", 40}, {"truthfulqa_mc2", 40}, {"mmlu_marketing", 10}, {"gsm8k", 4},
      {"wikitext", 1}};
  for (const auto& [name, limit] : runs) {
    eval::HarnessOptions o;
    o.limit = limit;
    if (name == "gsm8k") o.max_gen_toks = 32;
    const auto r = eval::run_task(one(name), *m, o);
    EXPECT_EQ(r.n_docs, static_cast<size_t>(limit)) << name;
    ASSERT_FALSE(r.metrics.empty()) << name;
    for (const auto& mv : r.metrics) {
      EXPECT_TRUE(std::isfinite(mv.value)) << name << " " << mv.name;
      if (mv.name == "acc" || mv.name == "acc_norm" || mv.name == "exact_match") {
        EXPECT_GE(mv.value, 0.0) << name;
        EXPECT_LE(mv.value, 1.0) << name;
      }
    }
    std::printf("%-16s %s %.4f (%zu requests, %.1f s)\n", name.c_str(), r.metrics[0].name.c_str(), r.metrics[0].value,
                r.n_requests, r.seconds);
  }
}
