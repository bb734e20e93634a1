// kiln synth: its shape table equals ../shared/bench/shapes.json, and a written folder loads
// and generates.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli_util.h"
#include "kiln/base/json.h"
#include "kiln/cli/synth_shapes.h"
#include "kiln/io/safetensors.h"

namespace fs = std::filesystem;

TEST(Synth, ShapesMatchSharedBenchShapes) {
  auto j = kiln::read_json_file(std::string(KILN_SHARED_DIR) + "/bench/shapes.json");
  int n = 0;
  for (auto& [name, v] : j.items()) {
    if (name.rfind("_", 0) == 0) continue;
    ++n;
    const auto& s = kiln::cli::synth_shape(name);
    EXPECT_EQ(s.model_type, v["model_type"].get<std::string>()) << name;
    EXPECT_EQ(s.hidden_size, v["hidden_size"].get<int>()) << name;
    EXPECT_EQ(s.num_hidden_layers, v["num_hidden_layers"].get<int>()) << name;
    EXPECT_EQ(s.num_attention_heads, v["num_attention_heads"].get<int>()) << name;
    EXPECT_EQ(s.num_key_value_heads, v["num_key_value_heads"].get<int>()) << name;
    EXPECT_EQ(s.intermediate_size, v["intermediate_size"].get<int>()) << name;
    EXPECT_EQ(s.vocab_size, v["vocab_size"].get<int>()) << name;
    EXPECT_EQ(s.rope_theta, v["rope_theta"].get<double>()) << name;
    EXPECT_EQ(s.tie_word_embeddings, v.value("tie_word_embeddings", false)) << name;
    EXPECT_EQ(s.head_dim, v.value("head_dim", 0)) << name;
  }
  EXPECT_EQ(n, static_cast<int>(kiln::cli::synth_shapes().size()));
}

TEST(Synth, TinyFolderGenerates) {
  std::string dir = kiln::test::make_temp_dir("kiln-synth-");
  for (std::string dtype : {"bf16", "f32"}) {
    std::string out = dir + "/tiny-" + dtype;
    auto w = kiln::test::run_kiln({"synth", "--shape", "tiny", "--out", out, "--dtype", dtype});
    ASSERT_EQ(w.exit_code, 0) << w.err;
    EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
    auto g = kiln::test::run_kiln({"generate", "--model", out, "--prompt", "Once", "--max-tokens", "8"});
    EXPECT_EQ(g.exit_code, 0) << g.err;
  }
  auto again = kiln::test::run_kiln({"synth", "--shape", "tiny", "--out", dir + "/tiny-f32"});
  EXPECT_NE(again.exit_code, 0);  // refuses to overwrite
  EXPECT_NE(again.err.find("--force"), std::string::npos) << again.err;
  auto bad = kiln::test::run_kiln({"synth", "--shape", "nope", "--out", dir + "/x"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("llama-3-8b"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}

// --q-bits writes every Linear and the embedding in the MLX affine layout (u32 codes, scales and
// biases per group, the quantization section in config.json), which loads and generates.
TEST(Synth, QuantizedFolderLoadsAndGenerates) {
  std::string dir = kiln::test::make_temp_dir("kiln-synth-q-");
  const std::string out = dir + "/tiny-q4";
  auto w = kiln::test::run_kiln({"synth", "--shape", "tiny", "--out", out, "--q-bits", "4", "--q-group-size", "32"});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  const auto cfg = kiln::read_json_file(out + "/config.json");
  EXPECT_EQ(cfg["quantization"]["bits"].get<int>(), 4);
  EXPECT_EQ(cfg["quantization"]["group_size"].get<int>(), 32);
  const auto ws = kiln::io::WeightSet::open_dir(out);
  for (const char* m : {"model.embed_tokens", "model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "lm_head"}) {
    const kiln::Tensor* q = ws.find(std::string(m) + ".weight");
    ASSERT_NE(q, nullptr) << m;
    EXPECT_EQ(q->dtype, kiln::DType::u32) << m;
    const kiln::Tensor* s = ws.find(std::string(m) + ".scales");
    ASSERT_NE(s, nullptr) << m;
    EXPECT_TRUE(ws.has(std::string(m) + ".biases")) << m;
    EXPECT_EQ(q->shape[1] * 8, s->shape[1] * 32) << m << ": 8 codes per word and 32 per group disagree on in";
  }
  EXPECT_EQ(ws.find("model.norm.weight")->dtype, kiln::DType::bf16);
  auto g = kiln::test::run_kiln({"generate", "--model", out, "--prompt", "Once", "--max-tokens", "8"});
  EXPECT_EQ(g.exit_code, 0) << g.err;
  auto bad = kiln::test::run_kiln({"synth", "--shape", "tiny", "--out", dir + "/x", "--q-bits", "7"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--q-bits"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}
