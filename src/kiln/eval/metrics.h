// lm-evaluation-harness's metrics over per-document scores: the mean and its standard error
// (sample standard deviation, ddof 1, over sqrt(n): lm-eval's mean_stderr), multiple-choice picks
// (acc: the highest loglikelihood; acc_norm: the highest loglikelihood per character of the choice,
// as lm-eval divides by len(choice)), TruthfulQA's mc2, weighted perplexities for rolling
// loglikelihoods, and exact_match with regex filters (GSM8K's strict-match / flexible-extract).
#pragma once
#include <span>
#include <string>
#include <vector>

namespace kiln::eval {

struct Estimate {
  double value = 0, stderr_ = 0;
};
// Mean and lm-eval's mean_stderr (0 for fewer than 2 values).
Estimate mean_stderr(std::span<const double> x);

// Index of the largest value (the first on ties, as numpy's argmax).
size_t argmax(std::span<const double> x);
// acc_norm's pick: argmax of lls[i] / len(choices[i]) with len in Unicode code points (Python len).
size_t argmax_normalized(std::span<const double> lls, std::span<const std::string> choices);
// Code points of UTF-8 text.
size_t utf8_length(const std::string& s);

// TruthfulQA mc2: the true answers' share of the probability mass, sum(p_true) / sum(p_all), with
// p = exp(ll); the choices labelled 1 come first (lm-eval splits at the first 0 label).
double mc2_score(std::span<const double> lls, std::span<const int> labels);

// lm-eval's weighted_perplexity: exp(-sum(ll) / sum(weights)); bits_per_byte: -sum(ll) / sum(bytes) / ln 2.
double weighted_perplexity(std::span<const double> lls, std::span<const double> weights);
double bits_per_byte(std::span<const double> lls, std::span<const double> bytes);

// lm-eval's regex filter: the match (its first non-empty group when the regex has groups) at
// group_select (negative: from the end) of all matches, or "[invalid]" when none matches.
std::string regex_extract(const std::string& text, const std::string& regex, int group_select);
// lm-eval's exact_match on one pair: both strings have regexes_to_ignore removed, then are
// lowercased (ignore_case) and compared.
bool exact_match(std::string pred, std::string ref, std::span<const std::string> regexes_to_ignore, bool ignore_case);

}  // namespace kiln::eval
