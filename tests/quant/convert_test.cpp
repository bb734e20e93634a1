// quant::convert on the real stories260K folder: a quantized folder written by kiln reloads with
// tensors identical (byte for byte) to quantize() of the source weights; config.json carries mlx-lm's
// quantization section (and its quantization_config mirror); layers whose input dimension is not a
// multiple of the group size stay float; recipes record per-module bits; -d restores float tensors
// equal to dequantize(); an existing destination is refused unless overwriting is asked for.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/base/json.h"
#include "kiln/io/safetensors.h"
#include "kiln/quant/affine.h"
#include "kiln/quant/convert.h"
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
