// Metric arithmetic (metrics.h), in double. Regexes are std::regex ECMAScript (Python's re for the
// patterns lm-eval's tasks use; "(?s)" has no ECMAScript form and is rewritten to [\s\S]).
#include "kiln/eval/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <regex>

namespace kiln::eval {

Estimate mean_stderr(std::span<const double> x) {
  Estimate e;
  if (x.empty()) return e;
  const double n = static_cast<double>(x.size());
  e.value = std::accumulate(x.begin(), x.end(), 0.0) / n;
  if (x.size() < 2) return e;
  double v = 0;
  for (double a : x) v += (a - e.value) * (a - e.value);
  e.stderr_ = std::sqrt(v / (n - 1)) / std::sqrt(n);
  return e;
}

size_t argmax(std::span<const double> x) {
  return static_cast<size_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

size_t argmax_normalized(std::span<const double> lls, std::span<const std::string> choices) {
  std::vector<double> v(lls.size());
  for (size_t i = 0; i < lls.size(); ++i) v[i] = lls[i] / std::max<double>(1.0, static_cast<double>(utf8_length(choices[i])));
  return argmax(v);
}

double mc2_score(std::span<const double> lls, std::span<const int> labels) {
  size_t split = std::find(labels.begin(), labels.end(), 0) - labels.begin();
  double t = 0, all = 0;
  for (size_t i = 0; i < lls.size(); ++i) {
    const double p = std::exp(lls[i]);
    all += p;
    if (i < split) t += p;
  }
  return all > 0 ? t / all : 0;
}

double weighted_perplexity(std::span<const double> lls, std::span<const double> w) {
  const double s = std::accumulate(lls.begin(), lls.end(), 0.0), n = std::accumulate(w.begin(), w.end(), 0.0);
  return std::exp(-s / n);
}

double bits_per_byte(std::span<const double> lls, std::span<const double> bytes) {
  const double s = std::accumulate(lls.begin(), lls.end(), 0.0), n = std::accumulate(bytes.begin(), bytes.end(), 0.0);
  return -s / n / std::log(2.0);
}

namespace {
std::regex compile(std::string re) {
  if (re.rfind("(?s)", 0) == 0) {  // dotall: '.' -> [\s\S]
    re = re.substr(4);
    std::string o;
    for (size_t i = 0; i < re.size(); ++i) {
      if (re[i] == '\\' && i + 1 < re.size()) { o += re[i]; o += re[++i]; continue; }
      o += re[i] == '.' ? std::string("[\\s\\S]") : std::string(1, re[i]);
    }
    re = o;
  }
  return std::regex(re, std::regex::ECMAScript);
}
}  // namespace

std::string regex_extract(const std::string& text, const std::string& regex, int group_select) {
  const std::regex re = compile(regex);
  std::vector<std::string> matches;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    std::string s = m.str(0);
    if (m.size() > 1) {  // Python's findall gives the groups; lm-eval takes the first non-empty one
      s.clear();
      for (size_t g = 1; g < m.size(); ++g)
        if (m[g].matched && m[g].length() > 0) { s = m[g].str(); break; }
    }
    matches.push_back(s);
  }
  if (matches.empty()) return "[invalid]";
  const int n = static_cast<int>(matches.size());
  int i = group_select < 0 ? n + group_select : group_select;
  if (i < 0 || i >= n) i = group_select < 0 ? 0 : n - 1;
  std::string s = matches[static_cast<size_t>(i)];
  // lm-eval strips the selected match
  const auto b = s.find_first_not_of(" \t\n\r"), e = s.find_last_not_of(" \t\n\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool exact_match(std::string pred, std::string ref, std::span<const std::string> ignore, bool ignore_case) {
  for (const auto& r : ignore) {
    const std::regex re = compile(r);
    pred = std::regex_replace(pred, re, "");
    ref = std::regex_replace(ref, re, "");
  }
  if (ignore_case) {
    for (auto* s : {&pred, &ref})
      std::transform(s->begin(), s->end(), s->begin(), [](unsigned char c) { return std::tolower(c); });
  }
  return pred == ref;
}

}  // namespace kiln::eval
