// Finding per-expert tensor groups and stacking them into mlx-lm's switch_mlp layout (moe_layout.h).
#include "kiln/quant/moe_layout.h"

#include <cctype>
#include <cstring>
#include <set>

#include "kiln/base/error.h"

namespace kiln::quant {

namespace {

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;  // 9 digits fit an int
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

bool is_switch_proj(const std::string& p) {
  return p == "gate_proj" || p == "up_proj" || p == "down_proj" || p == "w1" || p == "w2" || p == "w3";
}

}  // namespace

std::optional<ExpertTensorName> parse_expert_tensor(const std::string& name) {
  const std::string key = ".experts.";
  const size_t at = name.rfind(key);
  if (at == std::string::npos) return std::nullopt;
  const std::string rest = name.substr(at + key.size());  // "E.PROJ.SUFFIX"
  const size_t d1 = rest.find('.');
  if (d1 == std::string::npos) return std::nullopt;
  const size_t d2 = rest.find('.', d1 + 1);
  if (d2 == std::string::npos || rest.find('.', d2 + 1) != std::string::npos) return std::nullopt;
  ExpertTensorName n;
  const std::string idx = rest.substr(0, d1);
  n.proj = rest.substr(d1 + 1, d2 - d1 - 1);
  n.suffix = rest.substr(d2 + 1);
  if (!all_digits(idx) || !is_switch_proj(n.proj)) return std::nullopt;
  if (n.suffix != "weight" && n.suffix != "scales" && n.suffix != "biases" && n.suffix != "bias") return std::nullopt;
  n.block = name.substr(0, at + 1);  // keeps the trailing dot: "model.layers.0.mlp."
  n.expert = std::stoi(idx);
  return n;
}

std::string switch_proj_name(const std::string& proj) {
  if (proj == "w1") return "gate_proj";
  if (proj == "w2") return "down_proj";
  if (proj == "w3") return "up_proj";
  return proj;
}

std::map<std::string, ExpertGroup> find_expert_groups(const std::vector<std::string>& names) {
  std::map<std::string, std::map<int, std::string>> found;  // stacked path -> expert -> source module
  std::set<std::string> blocks;
  for (const auto& name : names) {
    auto n = parse_expert_tensor(name);
    if (!n || n->suffix != "weight") continue;
    const std::string stacked = n->block + "switch_mlp." + switch_proj_name(n->proj);
    auto& slot = found[stacked][n->expert];
    const std::string mod = name.substr(0, name.size() - 7);  // without ".weight"
    if (!slot.empty() && slot != mod)  // e.g. experts.0.w1 and experts.0.gate_proj in one block
      fail("convert", "{} and {} both map to {}; the folder mixes expert naming schemes", slot, mod, stacked);
    slot = mod;
    blocks.insert(n->block);
  }
  std::set<std::string> names_set(names.begin(), names.end());
  std::map<std::string, ExpertGroup> groups;
  for (auto& [stacked, by_index] : found) {
    ExpertGroup g;
    g.stacked = stacked;
    int want = 0;
    for (auto& [e, mod] : by_index) {
      if (e != want)
        fail("convert", "{}: expert {} is missing (found experts up to {}); a per-expert MoE checkpoint needs "
             "experts 0 .. n-1 of every projection", stacked, want, by_index.rbegin()->first);
      g.experts.push_back(mod);
      ++want;
    }
    if (names_set.count(stacked + ".weight"))
      fail("convert", "{} has both per-expert tensors and the stacked {}.weight; keep one layout", stacked, stacked);
    groups.emplace(stacked, std::move(g));
  }
  return groups;
}

Tensor stack_tensors(const std::vector<Tensor>& t, const std::string& what) {
  KILN_ASSERT(!t.empty(), "stack of nothing ({})", what);
  for (const auto& x : t)
    if (x.dtype != t[0].dtype || x.shape != t[0].shape)
      fail("convert", "{}: experts differ ({} {} vs {} {}); stacked experts must share dtype and shape", what,
           dtype_name(t[0].dtype), shape_str(t[0].shape), dtype_name(x.dtype), shape_str(x.shape));
  Shape s{static_cast<int64_t>(t.size())};
  s.insert(s.end(), t[0].shape.begin(), t[0].shape.end());
  Tensor r = Tensor::host(t[0].dtype, s);
  const size_t each = t[0].nbytes();
  for (size_t i = 0; i < t.size(); ++i) std::memcpy(static_cast<char*>(r.data) + i * each, t[i].data, each);
  return r;
}

void restack_quant_entries(Json& section, const std::map<std::string, ExpertGroup>& groups) {
  for (const auto& [stacked, g] : groups) {
    std::optional<Json> entry;
    for (const auto& mod : g.experts) {
      auto it = section.find(mod);
      if (it == section.end()) continue;
      if (entry && *entry != *it)
        fail("convert", "config.json's quantization entries of {} differ between experts ({} vs {}); a stacked "
             "module has one setting", stacked, entry->dump(), it->dump());
      entry = *it;
      section.erase(it);
    }
    if (entry) section[stacked] = *entry;
  }
}

void add_mlx_lm_moe_keys(Json& config) {
  const std::string type = json_get<std::string>(config, "model_type", "config.json").value_or("");
  if (type != "qwen3_moe" && type != "mixtral") return;
  if (type == "qwen3_moe" && !config.contains("num_experts") && config.contains("num_local_experts"))
    config["num_experts"] = config["num_local_experts"];
  if (!config.contains("rope_theta")) {
    auto rp = config.find("rope_parameters");
    if (rp != config.end() && rp->is_object() && rp->contains("rope_theta") &&
        json_get<std::string>(*rp, "rope_type", "config.json rope_parameters").value_or("default") == "default")
      config["rope_theta"] = (*rp)["rope_theta"];
  }
}

}  // namespace kiln::quant
