// The generated model card (model_card.h).
#include "kiln/hub/model_card.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/base/error.h"
#include "kiln/base/version.h"

namespace kiln::hub {

void write_eval_file(const std::string& dir, const EvalFigures& f) {
  nlohmann::json j = {{"perplexity", f.perplexity}, {"perplexity_se", f.perplexity_se}};
  if (f.kl_mean >= 0) j["kl_mean"] = f.kl_mean, j["kl_p99"] = f.kl_p99;
  if (!f.dataset.empty()) j["dataset"] = f.dataset;
  if (!f.reference.empty()) j["reference"] = f.reference;
  const std::string path = dir + "/" + kEvalFile, tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out.flush()) fail("hub", "cannot write {} (is the model folder writable?)", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("hub", "cannot write {}: {}", path, ec.message());
}

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) return nullptr;
  return nlohmann::json::parse(f, nullptr, false);
}

bool repo_id_like(const std::string& s) {
  size_t slash = s.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < s.size() && s.find('/', slash + 1) == std::string::npos &&
         s[0] != '.' && !std::filesystem::exists(s);
}

std::string fmt_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

std::string model_card(const std::string& dir, const std::string& repo, const std::string& base_model_flag) {
  const nlohmann::json config = read_json(dir + "/config.json");
  std::string base = base_model_flag;
  if (base.empty() && config.is_object() && config.contains("_name_or_path") && config["_name_or_path"].is_string() &&
      repo_id_like(config["_name_or_path"].get<std::string>()))
    base = config["_name_or_path"].get<std::string>();
  std::string md = "---\nlibrary_name: mlx\n";
  if (!base.empty()) md += "base_model: " + base + "\n";
  md += "pipeline_tag: text-generation\ntags:\n- mlx\n- kiln\n---\n\n# " + repo + "\n\n";
  md += "This model [" + repo + "](https://huggingface.co/" + repo + ") was converted to MLX format";
  if (!base.empty()) md += " from [" + base + "](https://huggingface.co/" + base + ")";
  md += std::string(" using kiln version ") + kVersion + ".\n";

  if (config.is_object() && config.contains("quantization") && config["quantization"].is_object()) {
    const auto& q = config["quantization"];
    size_t overrides = 0;
    for (const auto& [k, v] : q.items())
      if (v.is_object() || v.is_boolean()) ++overrides;
    md += "\n## Quantization\n\n| bits | group size | mode | per-layer overrides |\n|---|---|---|---|\n";
    md += "| " + (q.contains("bits") ? q["bits"].dump() : std::string("-")) + " | " +
          (q.contains("group_size") ? q["group_size"].dump() : std::string("-")) + " | " +
          q.value("mode", std::string("affine")) + " | " + std::to_string(overrides) + " |\n";
  } else {
    md += "\nThe weights are not quantized";
    if (config.is_object() && config.contains("torch_dtype") && config["torch_dtype"].is_string())
      md += " (" + config["torch_dtype"].get<std::string>() + ")";
    md += ".\n";
  }

  const nlohmann::json ev = read_json(dir + "/" + kEvalFile);
  if (ev.is_object()) {
    auto num = [&](const char* k) { return ev.contains(k) && ev[k].is_number() ? fmt_num(ev[k].get<double>()) : std::string("-"); };
    md += "\n## Quality\n\n";
    if (ev.contains("dataset")) md += "Measured on " + ev["dataset"].get<std::string>();
    if (ev.contains("reference")) md += std::string(ev.contains("dataset") ? ", " : "Measured ") + "KL against " +
                                        ev["reference"].get<std::string>();
    if (ev.contains("dataset") || ev.contains("reference")) md += ".\n\n";
    md += "| perplexity | ± | KL mean | KL p99 |\n|---|---|---|---|\n";
    md += "| " + num("perplexity") + " | " + num("perplexity_se") + " | " + num("kl_mean") + " | " + num("kl_p99") + " |\n";
  }

  md += "\n## Use with kiln\n\n```bash\nkiln pull " + repo + "\nkiln generate --model " + repo +
        " --prompt \"Once upon a time\"\n```\n\n## Use with mlx-lm\n\n```bash\npip install mlx-lm\nmlx_lm.generate --model " +
        repo + " --prompt \"Once upon a time\"\n```\n";
  return md;
}

}  // namespace kiln::hub
