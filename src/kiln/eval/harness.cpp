// The evaluator (harness.h). Per output type:
//   multiple_choice: one loglikelihood request per (context, choice): context + delimiter + choice,
//     or per context (WinoGrande) with the one target; acc / acc_norm from the lls, mc2 from them.
//   loglikelihood: (context, delimiter + target): perplexity = exp(-mean ll), acc = is_greedy.
//   loglikelihood_rolling: rolling windows of the document's tokens over max_length.
//   generate_until: the context, stop strings, max_gen_toks; exact_match after the task's filters.
#include "kiln/eval/harness.h"

#include <chrono>
#include <cmath>

#include "kiln/base/error.h"
#include "kiln/eval/metrics.h"

namespace kiln::eval {

LoglikelihoodRequest encode_pair(const tokenizer::Tokenizer& tok, std::string context, std::string continuation,
                                 bool add_special_tokens) {
  const size_t keep = context.find_last_not_of(' ');
  const size_t n_spaces = keep == std::string::npos ? context.size() : context.size() - keep - 1;
  if (n_spaces > 0) {
    continuation = context.substr(context.size() - n_spaces) + continuation;
    context.resize(context.size() - n_spaces);
  }
  LoglikelihoodRequest r;
  if (context.empty()) {
    const auto p = tok.bos_id() ? tok.bos_id() : tok.eos_id();
    if (!p) fail("eval", "an empty context needs a prefix token, and the tokenizer has no BOS or EOS");
    r.context = {*p};
    r.continuation = tok.encode(continuation, false);
    return r;
  }
  const auto whole = tok.encode(context + continuation, add_special_tokens);
  r.context = tok.encode(context, add_special_tokens);
  const size_t n = std::min(r.context.size(), whole.size());
  r.continuation.assign(whole.begin() + n, whole.end());
  if (r.continuation.empty()) r.continuation = tok.encode(continuation, false);  // (merged into the context)
  return r;
}

size_t limited(size_t n, double limit) {
  if (limit < 0) return n;
  if (limit < 1.0) return static_cast<size_t>(std::ceil(static_cast<double>(n) * limit));
  return std::min(n, static_cast<size_t>(limit));
}

namespace {

const std::vector<std::string> kGsmIgnore = {",", "\\$", "(?s).*#### ", "\\.$"};

void add(TaskResult& r, const std::string& name, std::span<const double> per_doc, const std::string& filter = "none") {
  const Estimate e = mean_stderr(per_doc);
  r.metrics.push_back({name, filter, e.value, true, e.stderr_});
  if (r.primary_scores.empty()) r.primary_scores.assign(per_doc.begin(), per_doc.end());
}

}  // namespace

TaskResult run_task(const Task& t, engine::LoadedModel& m, const HarnessOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  TaskResult res;
  res.name = t.name;
  res.group = t.group;
  res.version = t.version;
  res.shots = opt.prompt.shots >= 0 ? opt.prompt.shots : t.default_shots;
  res.n_original = t.docs.size();
  res.skipped_rows = t.skipped_rows;
  const size_t n = limited(t.docs.size(), opt.limit);
  res.n_docs = n;
  const tokenizer::Tokenizer& tok = *m.tokenizer;
  ScoreOptions so;
  so.batch_size = opt.batch_size;
  so.group_prefixes = opt.group_prefixes;
  so.max_length = opt.max_length;
  if (opt.progress) so.progress = [&](size_t d, size_t tot) { opt.progress(t.name, d, tot); };
  // Every doc's context(s), once, in doc order: the few-shot draws advance one generator across
  // the docs as lm-eval's (seeded 1234 per task).
  PyRandom rng(1234);
  PromptOptions po = opt.prompt;
  po.rng = &rng;
  std::vector<std::vector<std::string>> ctxs(n);
  for (size_t i = 0; i < n; ++i) ctxs[i] = contexts(t, t.docs[i], po);

  if (t.output_type == OutputType::generate_until) {
    std::vector<GenerateRequest> reqs;
    for (size_t i = 0; i < n; ++i) {
      GenerateRequest g;
      const std::string& ctx = ctxs[i][0];
      g.context = tok.encode(ctx, opt.add_special_tokens);
      if (g.context.empty()) g.context = {tok.bos_id().value_or(tok.eos_id().value_or(0))};
      g.until = t.until;
      g.max_gen_toks = opt.max_gen_toks > 0 ? opt.max_gen_toks : t.max_gen_toks;
      reqs.push_back(std::move(g));
    }
    GenerateOptions go;
    go.batch_size = opt.batch_size;
    go.max_length = opt.max_length;
    go.sampling = opt.sampling;
    go.eos_ids = m.eos_ids();
    go.progress = so.progress;
    const auto outs = generate_until(*m.model, tok, reqs, go);
    res.n_requests = reqs.size();
    if (opt.log_samples)
      for (size_t i = 0; i < n; ++i)
        res.samples.push_back({{"doc_id", i}, {"target", t.docs[i].target},
                               {"arguments", OrderedJson::array({OrderedJson::array({ctxs[i][0],
                                   {{"until", t.until}, {"max_gen_toks", reqs[i].max_gen_toks}}})})},
                               {"resps", OrderedJson::array({OrderedJson::array({outs[i]})})}});
    if (t.scoring == Scoring::gsm8k) {
      std::vector<double> strict, flex;
      for (size_t i = 0; i < n; ++i) {
        const std::string s = regex_extract(outs[i], "#### (\\-?[0-9\\.\\,]+)", 0);
        const std::string f = regex_extract(outs[i], "(-?[$0-9.,]{2,})|(-?[0-9]+)", -1);
        strict.push_back(exact_match(s, t.docs[i].target, kGsmIgnore, true));
        flex.push_back(exact_match(f, t.docs[i].target, kGsmIgnore, true));
      }
      add(res, "exact_match", strict, "strict-match");
      add(res, "exact_match", flex, "flexible-extract");
    } else {
      std::vector<double> em;
      auto strip = [](const std::string& s) {
        const auto b = s.find_first_not_of(" \t\n\r"), e = s.find_last_not_of(" \t\n\r");
        return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
      };
      for (size_t i = 0; i < n; ++i) em.push_back(strip(outs[i]) == strip(t.docs[i].target));
      add(res, "exact_match", em);
    }
  } else if (t.output_type == OutputType::loglikelihood_rolling) {
    std::vector<LoglikelihoodRequest> reqs;
    std::vector<size_t> doc_of;
    const int max_len = opt.max_length > 0 ? opt.max_length : default_max_length(m.config);
    const auto prefix = tok.bos_id() ? tok.bos_id() : tok.eos_id();
    if (!prefix) fail("eval", "rolling loglikelihoods need a prefix token, and the tokenizer has no BOS or EOS");
    for (size_t i = 0; i < n; ++i) {
      const auto ids = tok.encode(t.docs[i].target, false);
      for (auto& w : rolling_windows(ids, *prefix, max_len)) {
        reqs.push_back(std::move(w));
        doc_of.push_back(i);
      }
    }
    const auto lls = loglikelihood(*m.model, reqs, so);
    res.n_requests = reqs.size();
    std::vector<double> ll(n, 0.0), words(n), bytes(n);
    for (size_t k = 0; k < reqs.size(); ++k) ll[doc_of[k]] += lls[k].logprob;
    if (opt.log_samples)
      for (size_t i = 0; i < n; ++i)
        res.samples.push_back({{"doc_id", i}, {"arguments", OrderedJson::array({OrderedJson::array({t.docs[i].target})})},
                               {"resps", OrderedJson::array({OrderedJson::array({ll[i]})})}});
    for (size_t i = 0; i < n; ++i) {
      const std::string& o = t.docs[i].original.empty() ? t.docs[i].target : t.docs[i].original;
      // len(re.split(r"\s+", text)): runs of whitespace split; leading/trailing ones give empty pieces.
      size_t w = 1;
      for (size_t p = 0; p < o.size();) {
        if (std::isspace(static_cast<unsigned char>(o[p]))) {
          ++w;
          while (p < o.size() && std::isspace(static_cast<unsigned char>(o[p]))) ++p;
        } else ++p;
      }
      words[i] = static_cast<double>(w);
      bytes[i] = static_cast<double>(o.size());
    }
    res.metrics.push_back({"word_perplexity", "none", weighted_perplexity(ll, words)});
    res.metrics.push_back({"byte_perplexity", "none", weighted_perplexity(ll, bytes)});
    res.metrics.push_back({"bits_per_byte", "none", bits_per_byte(ll, bytes)});
  } else {
    // multiple_choice and loglikelihood: requests per doc, in order; first[i] = doc i's first request.
    std::vector<LoglikelihoodRequest> reqs;
    std::vector<std::pair<std::string, std::string>> texts;  // each request's (context, continuation)
    std::vector<size_t> first(n + 1, 0);
    auto push = [&](const std::string& c, const std::string& cont) {
      reqs.push_back(encode_pair(tok, c, cont, opt.add_special_tokens));
      texts.emplace_back(c, cont);
    };
    for (size_t i = 0; i < n; ++i) {
      first[i] = reqs.size();
      const Doc& d = t.docs[i];
      if (t.output_type == OutputType::loglikelihood) push(ctxs[i][0], t.target_delimiter + d.target);
      else if (!d.contexts.empty())
        for (const auto& c : ctxs[i]) push(c, t.target_delimiter + d.target);
      else
        for (const auto& ch : d.choices) push(ctxs[i][0], t.target_delimiter + ch);
    }
    first[n] = reqs.size();
    const auto lls = loglikelihood(*m.model, reqs, so);
    res.n_requests = reqs.size();
    if (opt.log_samples) {
      for (size_t i = 0; i < n; ++i) {
        OrderedJson args = OrderedJson::array(), ids = OrderedJson::array(), resps = OrderedJson::array();
        for (size_t k = first[i]; k < first[i + 1]; ++k) {
          args.push_back({texts[k].first, texts[k].second});
          ids.push_back({reqs[k].context, reqs[k].continuation});
          resps.push_back(OrderedJson::array({OrderedJson::array({lls[k].logprob, lls[k].is_greedy})}));
        }
        const Doc& d = t.docs[i];
        res.samples.push_back({{"doc_id", i},
                               {"target", t.output_type == OutputType::loglikelihood ? OrderedJson(d.target) : OrderedJson(d.gold)},
                               {"arguments", args}, {"token_ids", ids}, {"resps", resps}});
      }
    }
    if (t.output_type == OutputType::loglikelihood) {
      std::vector<double> acc, ll;
      for (size_t i = 0; i < n; ++i) {
        acc.push_back(lls[first[i]].is_greedy);
        ll.push_back(lls[first[i]].logprob);
      }
      // lm-eval's perplexity aggregation: exp(-mean(ll)); its stderr by the delta method.
      const Estimate e = mean_stderr(ll);
      res.metrics.push_back({"perplexity", "none", std::exp(-e.value), true, std::exp(-e.value) * e.stderr_});
      add(res, "acc", acc);
    } else {
      std::vector<double> acc, acc_norm, mc2;
      for (size_t i = 0; i < n; ++i) {
        std::vector<double> v;
        for (size_t k = first[i]; k < first[i + 1]; ++k) v.push_back(lls[k].logprob);
        const Doc& d = t.docs[i];
        if (t.scoring == Scoring::mc2) {
          mc2.push_back(mc2_score(v, d.labels));
          continue;
        }
        acc.push_back(argmax(v) == static_cast<size_t>(d.gold));
        if (t.acc_norm) acc_norm.push_back(argmax_normalized(v, d.choices) == static_cast<size_t>(d.gold));
      }
      if (t.scoring == Scoring::mc2) add(res, "acc", mc2);
      else {
        add(res, "acc", acc);
        if (t.acc_norm) add(res, "acc_norm", acc_norm);
      }
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

TaskResult aggregate_group(const std::string& name, const std::vector<TaskResult>& members) {
  TaskResult g;
  g.name = name;
  std::vector<double> all;
  for (const auto& m : members) {
    all.insert(all.end(), m.primary_scores.begin(), m.primary_scores.end());
    g.n_docs += m.n_docs;
    g.n_original += m.n_original;
    g.n_requests += m.n_requests;
    g.seconds += m.seconds;
    g.shots = m.shots;
    g.version = m.version;
  }
  add(g, "acc", all);
  return g;
}

OrderedJson results_json(const std::vector<TaskResult>& results, const OrderedJson& config) {
  OrderedJson j = OrderedJson::object();
  OrderedJson res = OrderedJson::object(), versions = OrderedJson::object(), shots = OrderedJson::object(),
              samples = OrderedJson::object();
  for (const auto& r : results) {
    OrderedJson o = OrderedJson::object();
    o["alias"] = r.group.empty() || r.group == r.name ? r.name : " - " + r.name;
    for (const auto& m : r.metrics) {
      o[m.name + "," + m.filter] = m.value;
      o[m.name + "_stderr," + m.filter] = m.has_stderr ? OrderedJson(m.stderr_) : OrderedJson("N/A");
    }
    res[r.name] = o;
    versions[r.name] = r.version;
    shots[r.name] = r.shots;
    samples[r.name] = {{"original", r.n_original}, {"effective", r.n_docs}};
  }
  j["results"] = res;
  j["versions"] = versions;
  j["n-shot"] = shots;
  j["n-samples"] = samples;
  j["config"] = config;
  return j;
}

}  // namespace kiln::eval
