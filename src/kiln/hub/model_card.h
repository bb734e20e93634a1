// The README.md `kiln upload` adds to a model folder that has none (as mlx_lm.upload's card):
// YAML front matter (library_name: mlx, tags, base_model, pipeline_tag), what the folder is, the
// quantization recipe read from its config.json ("quantization": bits, group size, mode, per-layer
// overrides), the quality figures of its kiln_eval.json when present, and how to run it with kiln.
#pragma once
#include <string>

namespace kiln::hub {

// kiln_eval.json (optional, in the folder): {"perplexity": P, "perplexity_se": S, "kl_mean": K,
// "kl_p99": K99, "dataset": "...", "reference": "ORG/NAME"}; any key may be absent.
inline constexpr const char* kEvalFile = "kiln_eval.json";

struct EvalFigures {
  double perplexity = 0, perplexity_se = 0;
  double kl_mean = -1, kl_p99 = -1;  // < 0: not measured (no reference)
  std::string dataset, reference;
};
// Writes dir/kiln_eval.json (through a temporary file and a rename: a crash leaves the old one).
void write_eval_file(const std::string& dir, const EvalFigures& f);

// base_model: "" = config.json's "_name_or_path" when it is a repo id, else left out.
std::string model_card(const std::string& dir, const std::string& repo, const std::string& base_model);

}  // namespace kiln::hub
