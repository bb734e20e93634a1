// quant::convert on the real stories260K folder: a quantized folder written by kiln reloads with
// tensors identical (byte for byte) to quantize() of the source weights; config.json carries mlx-lm's
// quantization section (and its quantization_config mirror); layers whose input dimension is not a
// multiple of the group size stay float; recipes record per-module bits; -d restores float tensors
// equal to dequantize(); an existing destination is refused unless overwriting is asked for.
// MoE (tiny-qwen3_moe, tiny-mixtral): per-expert tensors become mlx-lm's stacked switch_mlp tensors
// (float: the same bytes; 4-bit: quantize() of each expert), with mlx-lm's router rules and names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/base/json.h"
#include "kiln/io/safetensors.h"
#include "kiln/quant/affine.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/moe_layout.h"
#include "kiln/quant/quant_config.h"
#include "kiln/quant/recipes.h"

using namespace kiln;
using namespace kiln::quant;
namespace fs = std::filesystem;

namespace {

const std::string kSrc = std::string(KILN_SHARED_DIR) + "/models/stories260K";

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("kiln_quant_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

}  // namespace

TEST(Convert, QuantizedFolderReloadsWithIdenticalTensors) {
  TempDir dst;
  ConvertOptions o;
  o.hf_path = kSrc;
  o.mlx_path = (dst.path / "q4").string();
  o.quantize = true;
  o.bits = 4;
  o.group_size = 32;
  ConvertReport r = convert(o);
  EXPECT_GT(r.n_quantized, 0u);
  EXPECT_GT(r.n_float, 0u);  // down_proj: in = 172 is not a multiple of 32

  io::WeightSet src = io::WeightSet::open_dir(kSrc), out = io::WeightSet::open_dir(o.mlx_path);
  Json cfg = read_json_file(o.mlx_path + "/config.json");
  ASSERT_TRUE(cfg.contains("quantization"));
  EXPECT_EQ(cfg["quantization"]["bits"], 4);
  EXPECT_EQ(cfg["quantization"]["group_size"], 32);
  EXPECT_EQ(cfg["quantization"]["mode"], "affine");
  EXPECT_EQ(cfg["quantization_config"], cfg["quantization"]);
  auto qc = QuantConfig::from_model_config(cfg, "config.json");
  ASSERT_TRUE(qc);
  EXPECT_TRUE(fs::exists(dst.path / "q4" / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(dst.path / "q4" / "generation_config.json"));

  int checked = 0;
  for (const auto& name : src.names()) {
    const Tensor& t = src.get(name);
    const std::string mod = name.substr(0, name.size() - 7);
    if (name.ends_with(".weight") && t.ndim() == 2 && t.dim(1) % 32 == 0) {
      QuantizedMatrix want = quantize(t, 4, 32, t.dtype);
      ASSERT_TRUE(out.has(mod + ".scales")) << mod;
      EXPECT_TRUE(same_bytes(out.get(name), want.weight)) << name;
      EXPECT_TRUE(same_bytes(out.get(mod + ".scales"), want.scales)) << mod;
      EXPECT_TRUE(same_bytes(out.get(mod + ".biases"), want.biases)) << mod;
      auto p = qc->for_module(mod, true);
      ASSERT_TRUE(p);
      EXPECT_EQ(p->bits, 4);
      ++checked;
    } else {
      EXPECT_FALSE(out.has(mod + ".scales")) << name;
      EXPECT_TRUE(same_bytes(out.get(name), t)) << name;  // float tensors pass through unchanged
    }
  }
  EXPECT_GT(checked, 10);

  // Dequantizing the folder gives the reference dequantization of every quantized matrix.
  ConvertOptions d;
  d.hf_path = o.mlx_path;
  d.mlx_path = (dst.path / "deq").string();
  d.dequantize = true;
  convert(d);
  io::WeightSet deq = io::WeightSet::open_dir(d.mlx_path);
  Json dcfg = read_json_file(d.mlx_path + "/config.json");
  EXPECT_FALSE(dcfg.contains("quantization"));
  EXPECT_FALSE(dcfg.contains("quantization_config"));
  for (const auto& name : src.names()) {
    ASSERT_TRUE(deq.has(name)) << name;
    const std::string mod = name.substr(0, name.size() - 7);
    EXPECT_FALSE(deq.has(mod + ".scales"));
    if (out.has(mod + ".scales")) {
      QuantizedMatrix q{out.get(name), out.get(mod + ".scales"), out.get(mod + ".biases"), 4, 32};
      EXPECT_TRUE(same_bytes(deq.get(name), dequantize(q, DType::f32))) << name;
    }
  }

  // The destination exists now: refused, unless overwriting.
  EXPECT_THROW(convert(o), Error);
  o.overwrite = true;
  EXPECT_NO_THROW(convert(o));
  // Quantizing a quantized folder is refused.
  ConvertOptions again = o;
  again.hf_path = o.mlx_path;
  again.mlx_path = (dst.path / "again").string();
  EXPECT_THROW(convert(again), Error);
}

TEST(Convert, RecipeRecordsPerModuleBits) {
  TempDir dst;
  ConvertOptions o;
  o.hf_path = kSrc;
  o.mlx_path = dst.path.string();
  o.quantize = true;
  o.group_size = 32;
  o.quant_predicate = "mixed_3_6";
  convert(o);
  Json cfg = read_json_file(o.mlx_path + "/config.json");
  auto qc = QuantConfig::from_model_config(cfg, "config.json");
  ASSERT_TRUE(qc);
  io::WeightSet out = io::WeightSet::open_dir(o.mlx_path);
  // stories260K: 5 layers -> n/8 = 0, 7n/8 = 4: layers 2 and 4 ((i - 0) % 3 == 2, i >= 4) get 6 bits.
  for (int layer = 0; layer < 5; ++layer) {
    const std::string v = "model.layers." + std::to_string(layer) + ".self_attn.v_proj";
    const std::string q = "model.layers." + std::to_string(layer) + ".self_attn.q_proj";
    const int want_v = (layer == 2 || layer == 4) ? 6 : 3;
    ASSERT_TRUE(cfg["quantization"].contains(v)) << v;
    EXPECT_EQ(cfg["quantization"][v]["bits"], want_v) << v;
    EXPECT_EQ(cfg["quantization"][q]["bits"], 3) << q;
    EXPECT_EQ(qc->for_module(v, true)->bits, want_v);
    // The packed width says the same: 64 inputs at `bits` -> 64 * bits / 32 words per row.
    EXPECT_EQ(out.get(v + ".weight").dim(1), 64 * want_v / 32) << v;
  }
  // down_proj (in = 172) stays float and gets no entry.
  EXPECT_FALSE(cfg["quantization"].contains("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(out.has("model.layers.0.mlp.down_proj.scales"));
}

TEST(Convert, RecipeLayerChoiceMatchesMlxLm) {
  // 32 layers: n/8 = 4, 7n/8 = 28. High bits: i < 4, i >= 28, and (i - 4) % 3 == 2 -> 6, 9, ..., 27.
  Recipe r = *recipe_from_name("mixed_4_6");
  int loc = recipe_layer_location({"model.embed_tokens", "model.layers.0.mlp.down_proj"});
  EXPECT_EQ(loc, 2);
  for (int i = 0; i < 32; ++i) {
    const bool more = i < 4 || i >= 28 || (i - 4) % 3 == 2;
    EXPECT_EQ(recipe_params(r, "model.layers." + std::to_string(i) + ".mlp.down_proj", loc, 32, 64).bits, more ? 6 : 4);
    EXPECT_EQ(recipe_params(r, "model.layers." + std::to_string(i) + ".mlp.up_proj", loc, 32, 64).bits, 4);
  }
  EXPECT_EQ(recipe_params(r, "lm_head", loc, 32, 64).bits, 6);
  EXPECT_EQ(recipe_params(r, "model.embed_tokens", loc, 32, 64).bits, 4);  // neither v_proj, down_proj nor lm_head
  EXPECT_THROW(recipe_from_name("mixed_5_7"), Error);
}

TEST(QuantConfigParse, ReadsMlxSectionsAndRejectsOthers) {
  Json cfg = parse_json(R"({"model_type": "llama", "quantization": {"group_size": 64, "bits": 4,
      "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}, "lm_head": false}})", "t");
  auto qc = QuantConfig::from_model_config(cfg, "t");
  ASSERT_TRUE(qc);
  EXPECT_EQ(qc->for_module("model.layers.0.mlp.down_proj", true)->bits, 8);
  EXPECT_EQ(qc->for_module("model.layers.0.mlp.down_proj", true)->group_size, 32);
  EXPECT_FALSE(qc->for_module("lm_head", true));
  EXPECT_EQ(qc->for_module("model.layers.1.mlp.down_proj", true)->bits, 4);
  EXPECT_FALSE(qc->for_module("model.layers.1.mlp.down_proj", false));  // no .scales: float
  Json wrapped;
  wrapped["quantization"] = qc->to_json();  // written back, it parses to the same section
  EXPECT_EQ(QuantConfig::from_model_config(wrapped, "t")->to_json(), qc->to_json());
  EXPECT_FALSE(QuantConfig::from_model_config(parse_json(R"({"model_type": "llama"})", "t"), "t"));
  EXPECT_THROW(QuantConfig::from_model_config(parse_json(R"({"quantization": {"bits": 7, "group_size": 64}})", "t"), "t"),
               Error);
  EXPECT_THROW(QuantConfig::from_model_config(
                   parse_json(R"({"quantization_config": {"quant_method": "gptq", "bits": 4}})", "t"), "t"),
               Error);
  EXPECT_THROW(QuantConfig::from_model_config(
                   parse_json(R"({"quantization": {"bits": 4, "group_size": 32, "mode": "mxfp4"}})", "t"), "t"),
               Error);
}

// ---- MoE: Hugging Face per-expert checkpoints are written in mlx-lm's stacked switch_mlp layout.

namespace {

struct MoeCase {
  std::string model, block, router;  // block: "mlp" / "block_sparse_moe"
  // mlx-lm's switch_mlp name -> the Hugging Face per-expert name
  std::vector<std::pair<std::string, std::string>> projs;
};

MoeCase qwen3_moe_case() {
  return {"tiny-qwen3_moe", "mlp", "mlp.gate", {{"gate_proj", "gate_proj"}, {"up_proj", "up_proj"}, {"down_proj", "down_proj"}}};
}
MoeCase mixtral_case() {  // mlx-lm's mixtral sanitize: w1 -> gate_proj, w2 -> down_proj, w3 -> up_proj
  return {"tiny-mixtral", "block_sparse_moe", "block_sparse_moe.gate", {{"gate_proj", "w1"}, {"down_proj", "w2"}, {"up_proj", "w3"}}};
}

// Checks every stacked projection of `dst` against the source experts: float (bits 0) = the same
// bytes, expert by expert; quantized = quantize() of each source expert, stacked.
void check_stacked(const MoeCase& mc, const std::string& dst, int bits, int group_size) {
  SCOPED_TRACE(mc.model + " bits " + std::to_string(bits));
  const std::string src_dir = std::string(KILN_SHARED_DIR) + "/models/" + mc.model;
  io::WeightSet src = io::WeightSet::open_dir(src_dir), out = io::WeightSet::open_dir(dst);
  Json cfg = read_json_file(src_dir + "/config.json");
  const int n_layers = cfg["num_hidden_layers"], n_experts = cfg["num_local_experts"];
  for (const auto& n : out.names()) EXPECT_EQ(n.find(".experts."), std::string::npos) << "per-expert tensor left: " << n;
  int checked = 0;
  for (int l = 0; l < n_layers; ++l) {
    const std::string L = "model.layers." + std::to_string(l) + ".";
    for (const auto& [mlx, hf] : mc.projs) {
      const std::string mod = L + mc.block + ".switch_mlp." + mlx;
      ASSERT_TRUE(out.has(mod + ".weight")) << mod;
      const Tensor& w = out.get(mod + ".weight");
      const Tensor& e0 = src.get(L + mc.block + ".experts.0." + hf + ".weight");
      const int64_t rows = e0.dim(0), in = e0.dim(1);
      ASSERT_EQ(w.ndim(), 3) << mod;
      EXPECT_EQ(w.dim(0), n_experts) << mod;
      EXPECT_EQ(w.dim(1), rows) << mod;
      if (bits == 0) {
        EXPECT_EQ(w.dtype, e0.dtype) << mod;
        EXPECT_EQ(w.dim(2), in) << mod;
        EXPECT_FALSE(out.has(mod + ".scales")) << mod;
      } else {
        EXPECT_EQ(w.dtype, DType::u32) << mod;
        EXPECT_EQ(w.dim(2), in * bits / 32) << mod;
        EXPECT_EQ(out.get(mod + ".scales").shape, (Shape{n_experts, rows, in / group_size})) << mod;
        EXPECT_EQ(out.get(mod + ".biases").shape, (Shape{n_experts, rows, in / group_size})) << mod;
        EXPECT_EQ(out.get(mod + ".scales").dtype, e0.dtype) << mod;
      }
      for (int e = 0; e < n_experts; ++e) {
        const Tensor& se = src.get(L + mc.block + ".experts." + std::to_string(e) + "." + hf + ".weight");
        auto slice = [&](const Tensor& t) { return t.view({t.dim(0) * t.dim(1), t.dim(2)}).slice_rows(e * rows, (e + 1) * rows); };
        if (bits == 0) {
          EXPECT_TRUE(same_bytes(slice(w), se)) << mod << " expert " << e;
        } else {
          QuantizedMatrix want = quantize(se, bits, group_size, se.dtype);
          EXPECT_TRUE(same_bytes(slice(w), want.weight)) << mod << " expert " << e;
          EXPECT_TRUE(same_bytes(slice(out.get(mod + ".scales")), want.scales)) << mod << " expert " << e;
          EXPECT_TRUE(same_bytes(slice(out.get(mod + ".biases")), want.biases)) << mod << " expert " << e;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, n_layers * 3 * n_experts);
}

ConvertOptions moe_options(const MoeCase& mc, const fs::path& dst, int bits, int group_size) {
  ConvertOptions o;
  o.hf_path = std::string(KILN_SHARED_DIR) + "/models/" + mc.model;
  o.mlx_path = dst.string();
  if (bits) {
    o.quantize = true;
    o.bits = bits;
    o.group_size = group_size;
  }
  return o;
}

}  // namespace

TEST(ConvertMoe, FloatFoldersAreStackedLosslessly) {
  for (const MoeCase& mc : {qwen3_moe_case(), mixtral_case()}) {
    TempDir dst;
    ConvertReport r = convert(moe_options(mc, dst.path, 0, 0));
    EXPECT_EQ(r.n_stacked, 3u * 3u) << mc.model;  // 3 layers x gate/up/down
    check_stacked(mc, dst.path.string(), 0, 0);
    Json cfg = read_json_file(dst.path.string() + "/config.json");
    EXPECT_FALSE(cfg.contains("quantization"));
    // The keys mlx-lm's ModelArgs read, next to transformers 5's (which stay).
    EXPECT_EQ(cfg["rope_theta"], cfg["rope_parameters"]["rope_theta"]) << mc.model;
    if (mc.model == "tiny-qwen3_moe") {
      EXPECT_EQ(cfg["num_experts"], cfg["num_local_experts"]);
    }
    // Non-expert tensors pass through.
    io::WeightSet src = io::WeightSet::open_dir(moe_options(mc, dst.path, 0, 0).hf_path), out = io::WeightSet::open_dir(dst.path.string());
    const std::string router = "model.layers.1." + mc.router + ".weight";
    EXPECT_TRUE(same_bytes(out.get(router), src.get(router)));
  }
}

TEST(ConvertMoe, QuantizedExpertsAndRouterRules) {
  // qwen3_moe: mlx-lm's quant_predicate keeps the router `mlp.gate` at 8 bits, group 64 (a config
  // entry per router); mixtral has no rule: its router is quantized with the defaults, no entry.
  for (const MoeCase& mc : {qwen3_moe_case(), mixtral_case()}) {
    TempDir dst;
    ConvertReport r = convert(moe_options(mc, dst.path, 4, 32));
    EXPECT_EQ(r.n_stacked, 9u);
    check_stacked(mc, dst.path.string(), 4, 32);
    io::WeightSet out = io::WeightSet::open_dir(dst.path.string());
    Json cfg = read_json_file(dst.path.string() + "/config.json");
    auto qc = QuantConfig::from_model_config(cfg, "config.json");
    ASSERT_TRUE(qc);
    const bool qwen = mc.model == "tiny-qwen3_moe";
    const int router_bits = qwen ? 8 : 4, router_group = qwen ? 64 : 32;
    const int64_t n_experts = qwen ? 8 : 4;
    for (int l = 0; l < 3; ++l) {
      const std::string router = "model.layers." + std::to_string(l) + "." + mc.router;
      const std::string down = "model.layers." + std::to_string(l) + "." + mc.block + ".switch_mlp.down_proj";
      EXPECT_EQ(cfg["quantization"].contains(router), qwen) << router;
      if (qwen) {
        EXPECT_EQ(cfg["quantization"][router], (Json{{"bits", 8}, {"group_size", 64}, {"mode", "affine"}}));
      }
      auto p = qc->for_module(router, out.has(router + ".scales"));
      ASSERT_TRUE(p) << router;
      EXPECT_EQ(p->bits, router_bits);
      EXPECT_EQ(p->group_size, router_group);
      EXPECT_EQ(out.get(router + ".weight").shape, (Shape{n_experts, 64 * router_bits / 32})) << router;
      EXPECT_EQ(out.get(router + ".scales").shape, (Shape{n_experts, 64 / router_group})) << router;
      EXPECT_FALSE(cfg["quantization"].contains(down)) << down;  // the defaults apply
    }
    EXPECT_EQ(cfg["quantization_config"], cfg["quantization"]);

    // -d writes float stacked experts equal to the reference dequantization, expert by expert.
    ConvertOptions d;
    d.hf_path = dst.path.string();
    d.mlx_path = (dst.path / "deq").string();
    d.dequantize = true;
    convert(d);
    io::WeightSet deq = io::WeightSet::open_dir(d.mlx_path);
    const std::string mod = "model.layers.2." + mc.block + ".switch_mlp.up_proj";
    const Tensor& w = deq.get(mod + ".weight");
    ASSERT_EQ(w.ndim(), 3);
    EXPECT_FALSE(deq.has(mod + ".scales"));
    const int64_t rows = w.dim(1);
    for (int64_t e = 0; e < w.dim(0); ++e) {
      auto slice = [&](const Tensor& t) { return t.view({t.dim(0) * t.dim(1), t.dim(2)}).slice_rows(e * rows, (e + 1) * rows); };
      QuantizedMatrix q{slice(out.get(mod + ".weight")), slice(out.get(mod + ".scales")), slice(out.get(mod + ".biases")), 4, 32};
      EXPECT_TRUE(same_bytes(slice(w), dequantize(q, w.dtype))) << mod << " expert " << e;
    }
    // ... and quantizing that float stacked folder again gives the same stacked codes (3-D weights).
    ConvertOptions again = moe_options(mc, dst.path / "again", 4, 32);
    again.hf_path = d.mlx_path;
    convert(again);
    io::WeightSet q2 = io::WeightSet::open_dir(again.mlx_path);
    EXPECT_EQ(q2.get(mod + ".weight").shape, out.get(mod + ".weight").shape);
    EXPECT_EQ(q2.get(mod + ".scales").shape, out.get(mod + ".scales").shape);
  }
}

TEST(ConvertMoe, RecipeNamesStackedModulesAndReplacesTheRouterRule) {
  // mlx-lm's quantize_model takes the recipe *instead of* the model's quant_predicate, so the
  // qwen3_moe router gets the recipe's low bits; the stacked down_proj gets per-layer entries.
  // 3 layers: n/8 = 0, 7n/8 = 2 -> only layer 2 uses more bits.
  TempDir dst;
  ConvertOptions o = moe_options(qwen3_moe_case(), dst.path, 0, 0);
  o.quantize = true;
  o.group_size = 32;
  o.quant_predicate = "mixed_3_6";
  convert(o);
  Json q = read_json_file(dst.path.string() + "/config.json")["quantization"];
  io::WeightSet out = io::WeightSet::open_dir(dst.path.string());
  for (int l = 0; l < 3; ++l) {
    const std::string L = "model.layers." + std::to_string(l) + ".mlp.";
    const int want = l == 2 ? 6 : 3;
    ASSERT_TRUE(q.contains(L + "switch_mlp.down_proj")) << l;
    EXPECT_EQ(q[L + "switch_mlp.down_proj"]["bits"], want);
    EXPECT_EQ(q[L + "switch_mlp.up_proj"]["bits"], 3);
    EXPECT_EQ(q[L + "gate"]["bits"], 3);
    EXPECT_FALSE(q.contains(L + "experts.0.down_proj"));
    // down_proj: in = moe_intermediate_size 32 -> 32 * bits / 32 words per row.
    EXPECT_EQ(out.get(L + "switch_mlp.down_proj.weight").dim(2), want) << l;
  }
}

TEST(ConvertMoe, ExpertNamesAndGroups) {
  auto n = parse_expert_tensor("model.layers.12.block_sparse_moe.experts.7.w2.scales");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->block, "model.layers.12.block_sparse_moe.");
  EXPECT_EQ(n->expert, 7);
  EXPECT_EQ(n->proj, "w2");
  EXPECT_EQ(n->suffix, "scales");
  EXPECT_EQ(switch_proj_name("w1"), "gate_proj");
  EXPECT_EQ(switch_proj_name("w2"), "down_proj");
  EXPECT_EQ(switch_proj_name("w3"), "up_proj");
  EXPECT_FALSE(parse_expert_tensor("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(parse_expert_tensor("model.layers.0.mlp.experts.x.up_proj.weight"));
  EXPECT_FALSE(parse_expert_tensor("model.layers.0.mlp.experts.0.q_proj.weight"));
  EXPECT_FALSE(parse_expert_tensor("model.layers.0.mlp.switch_mlp.up_proj.weight"));

  auto g = find_expert_groups({"model.layers.0.mlp.experts.1.up_proj.weight", "model.layers.0.mlp.experts.0.up_proj.weight",
                               "model.layers.0.mlp.experts.0.up_proj.scales", "model.norm.weight"});
  ASSERT_EQ(g.size(), 1u);
  const auto& grp = g.at("model.layers.0.mlp.switch_mlp.up_proj");
  EXPECT_EQ(grp.experts, (std::vector<std::string>{"model.layers.0.mlp.experts.0.up_proj", "model.layers.0.mlp.experts.1.up_proj"}));
  // A hole in the expert indices, or both layouts in one block, is refused.
  EXPECT_THROW(find_expert_groups({"a.experts.0.w1.weight", "a.experts.2.w1.weight"}), Error);
  EXPECT_THROW(find_expert_groups({"a.experts.0.w1.weight", "a.switch_mlp.gate_proj.weight"}), Error);

  // Per-expert config entries of a quantized per-expert folder collapse into the stacked module's.
  Json sec = {{"bits", 4}, {"group_size", 64}, {"a.experts.0.w1", {{"bits", 8}}}, {"a.experts.1.w1", {{"bits", 8}}}};
  restack_quant_entries(sec, find_expert_groups({"a.experts.0.w1.weight", "a.experts.1.w1.weight"}));
  EXPECT_EQ(sec, (Json{{"bits", 4}, {"group_size", 64}, {"a.switch_mlp.gate_proj", {{"bits", 8}}}}));
  Json bad = {{"a.experts.0.w1", {{"bits", 8}}}, {"a.experts.1.w1", {{"bits", 4}}}};
  EXPECT_THROW(restack_quant_entries(bad, find_expert_groups({"a.experts.0.w1.weight", "a.experts.1.w1.weight"})), Error);
}
