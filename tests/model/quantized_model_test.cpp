// Quantized models end to end on the CPU: each family's model folder converted by kiln (quant::convert)
// loads through config.json's quantization section (per-layer bits, quantized embeddings, quantized
// tied heads, phi3's fused projections split into row views, MoE experts), and its logits equal
// those of the same folder dequantized back to float (the same values through the dense kernels),
// for prefill (GEMM) and decode (GEMV) steps. Also: a folder whose config lacks the section fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "kiln/base/json.h"
#include "kiln/quant/convert.h"
#include "kiln/model/model.h"
#include "../model_test_util.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("kiln_qmodel_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

using Loaded = test::LoadedModel;
std::unique_ptr<Loaded> load(const std::string& dir) { return test::load_model_dir(dir); }

// Prefill 16 tokens (all logits), then decode one: logits [17, vocab] concatenated.
std::vector<float> run(Loaded& l) {
  auto kv = model::KvCache::allocate(*l.be, l.cfg, 8, 4);
  std::vector<float> all;
  auto step = [&](int begin, int end) {
    model::Batch b;
    b.n_seqs = 1;
    b.max_blocks = kv.n_blocks;
    for (int i = 0; i < kv.n_blocks; ++i) b.block_tables.push_back(i);
    for (int p = begin; p < end; ++p) {
      b.tokens.push_back((p * 37 + 5) % l.cfg.vocab_size);
      b.positions.push_back(p);
      b.token_seq.push_back(0);
      b.slots.push_back(p);
      b.logit_rows.push_back(p - begin);
    }
    Tensor t = l.m->forward(b, kv);
    all.insert(all.end(), t.ptr<float>(), t.ptr<float>() + t.numel());
  };
  step(0, 16);
  step(16, 17);
  return all;
}

void check_family(const std::string& name, int bits, int group_size) {
  SCOPED_TRACE(name + " " + std::to_string(bits) + "-bit g" + std::to_string(group_size));
  TempDir tmp(name + std::to_string(bits));
  quant::ConvertOptions q;
  q.hf_path = std::string(KILN_SHARED_DIR) + "/models/" + name;
  q.mlx_path = (tmp.path / "q").string();
  q.quantize = true;
  q.bits = bits;
  q.group_size = group_size;
  quant::convert(q);
  quant::ConvertOptions d;
  d.hf_path = q.mlx_path;
  d.mlx_path = (tmp.path / "d").string();
  d.dequantize = true;
  d.dtype = "float32";  // scale * q + bias exactly (a bf16 model's dequantized weights would be rounded)
  quant::convert(d);
  // ... but keep the checkpoint dtype the model's constants are rounded to (layers.h).
  Json src_cfg = read_json_file(q.hf_path + "/config.json"), dcfg = read_json_file(d.mlx_path + "/config.json");
  for (const char* k : {"torch_dtype", "dtype"})
    if (src_cfg.contains(k)) dcfg[k] = src_cfg[k];
    else dcfg.erase(k);
  std::ofstream(d.mlx_path + "/config.json") << dcfg.dump(2);

  auto lq = load(q.mlx_path);
  ASSERT_TRUE(lq->cfg.quant);
  // A quantized embedding (and tied head) when hidden_size is a multiple of the group size.
  EXPECT_EQ(lq->weights.has("model.embed_tokens.scales"), lq->cfg.dim % group_size == 0);
  auto ld = load(d.mlx_path);
  const std::vector<float> yq = run(*lq), yd = run(*ld);
  ASSERT_EQ(yq.size(), yd.size());
  double range = 0, max_err = 0;
  for (size_t i = 0; i < yq.size(); ++i) {
    ASSERT_TRUE(std::isfinite(yq[i])) << i;
    range = std::max(range, std::fabs(static_cast<double>(yd[i])));
    max_err = std::max(max_err, std::fabs(static_cast<double>(yq[i]) - yd[i]));
  }
  // Same weights, different kernels (fused dequant-dot vs dense): f32 rounding only.
  EXPECT_LT(max_err, 1e-4 * std::max(1.0, range)) << "max |logit diff| " << max_err << " of range " << range;
}

}  // namespace

TEST(QuantizedModel, Stories260KMatchesItsDequantizedSelf) {
  for (int bits : {8, 4, 3}) check_family("stories260K", bits, 32);
}

TEST(QuantizedModel, FamiliesLoadAndMatchDequantized) {
  check_family("tiny-phi3", 4, 64);                 // fused qkv / gate_up row views
  check_family("tiny-qwen2", 6, 32);                // q/k/v biases, tied head
  check_family("tiny-gemma3_text", 5, 64);          // bf16 scales, (1+w) norms, tied head
  check_family("tiny-mixtral", 2, 32);              // MoE experts and router, separate lm_head
  check_family("tiny-llama3_rope_scaled", 8, 128);  // bf16, g128
}

TEST(QuantizedModel, ScalesWithoutAQuantizationSectionFail) {
  TempDir tmp("noconfig");
  quant::ConvertOptions q;
  q.hf_path = std::string(KILN_SHARED_DIR) + "/models/stories260K";
  q.mlx_path = (tmp.path / "q").string();
  q.quantize = true;
  q.group_size = 32;
  quant::convert(q);
  Json cfg = read_json_file(q.mlx_path + "/config.json");
  cfg.erase("quantization");
  cfg.erase("quantization_config");
  std::ofstream(q.mlx_path + "/config.json") << cfg.dump();
  try {
    load(q.mlx_path);
    FAIL() << "loaded .scales without a quantization section";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantization"), std::string::npos) << e.what();
  }
}
