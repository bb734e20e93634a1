// Quantized models end to end on the CPU: each family's model folder converted by kiln (quant::convert)
// loads through config.json's quantization section (per-layer bits, quantized embeddings, quantized
// tied heads, phi3's fused projections split into row views, MoE experts), and its logits equal
// those of the same folder dequantized back to float (the same values through the dense kernels),
// for prefill (GEMM) and decode (GEMV) steps. Also: a folder whose config lacks the section fails.
// MoE folders are written in mlx-lm's stacked switch_mlp layout: the float re-layout gives the
// original model's logits and greedy tokens exactly; 4-bit stays close to the float model; per-module
// bits keyed by switch_mlp paths (a recipe) load and match their dequantized self.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kiln/base/json.h"
#include "kiln/io/safetensors.h"
#include "kiln/quant/affine.h"
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
  std::vector<int32_t> tokens(17);
  for (int p = 0; p < 17; ++p) tokens[p] = (p * 37 + 5) % l.cfg.vocab_size;
  auto step = [&](int begin, int end) {
    Tensor t = test::run_chunk(*l.m, kv, tokens, begin, end, true);
    all.insert(all.end(), t.ptr<float>(), t.ptr<float>() + t.numel());
  };
  step(0, 16);
  step(16, 17);
  return all;
}

void check_family(const std::string& name, int bits, int group_size, const std::string& recipe = "") {
  SCOPED_TRACE(name + " " + std::to_string(bits) + "-bit g" + std::to_string(group_size) + " " + recipe);
  TempDir tmp(name + std::to_string(bits) + recipe);
  quant::ConvertOptions q;
  q.hf_path = std::string(KILN_SHARED_DIR) + "/models/" + name;
  q.mlx_path = (tmp.path / "q").string();
  q.quantize = true;
  q.bits = bits;
  q.group_size = group_size;
  q.quant_predicate = recipe;
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
  check_family("tiny-mixtral", 2, 32);              // stacked MoE experts and router, separate lm_head
  check_family("tiny-qwen3_moe", 4, 32);            // stacked experts, 8-bit g64 router (per-module entry)
  check_family("tiny-qwen3_moe", 4, 32, "mixed_3_6");  // per-layer bits keyed by switch_mlp paths
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

// ---- MoE in mlx-lm's stacked layout against the original per-expert checkpoint.

namespace {

struct PromptRun {
  std::vector<float> logits;    // [n_prompt, vocab]
  std::vector<int32_t> greedy;  // prompt + greedy continuation
};

// The reference prompt (all logits, one prefill), then greedy decoding to the reference length.
PromptRun run_reference_prompt(Loaded& l, const Json& ref) {
  std::vector<int32_t> seq = ref["input_ids"].get<std::vector<int32_t>>();
  const size_t n = seq.size(), total = ref["greedy_ids"].size();
  const int V = l.cfg.vocab_size;
  auto kv = model::KvCache::allocate(*l.be, l.cfg, static_cast<int>(total + 3) / 4 + 1, 4);
  PromptRun r;
  Tensor t = test::run_chunk(*l.m, kv, seq, 0, static_cast<int>(n), true);
  r.logits.assign(t.ptr<float>(), t.ptr<float>() + t.numel());
  auto argmax = [&](const float* row) { return static_cast<int32_t>(std::max_element(row, row + V) - row); };
  int32_t next = argmax(t.ptr<float>() + (n - 1) * V);
  while (seq.size() < total) {
    seq.push_back(next);
    Tensor lg = test::run_chunk(*l.m, kv, seq, static_cast<int>(seq.size()) - 1, static_cast<int>(seq.size()), false);
    next = argmax(lg.ptr<float>());
  }
  r.greedy = seq;
  return r;
}

std::string convert_moe(const std::string& name, const fs::path& dst, int bits) {
  quant::ConvertOptions o;
  o.hf_path = std::string(KILN_SHARED_DIR) + "/models/" + name;
  o.mlx_path = dst.string();
  if (bits) {
    o.quantize = true;
    o.bits = bits;
    o.group_size = 32;
  }
  quant::ConvertReport r = quant::convert(o);
  EXPECT_EQ(r.n_stacked, 9u) << name;  // 3 layers x gate/up/down
  return o.mlx_path;
}

}  // namespace

class StackedMoe : public ::testing::TestWithParam<std::string> {};

TEST_P(StackedMoe, FloatReLayoutIsExact) {
  const std::string name = GetParam(), src = std::string(KILN_SHARED_DIR) + "/models/" + name;
  TempDir tmp(name + "_float");
  const std::string dst = convert_moe(name, tmp.path / "f", 0);
  ASSERT_TRUE(io::WeightSet::open_dir(dst).has("model.layers.0." + std::string(name == "tiny-mixtral" ? "block_sparse_moe" : "mlp") +
                                               ".switch_mlp.gate_proj.weight"));
  Json ref = read_json_file(src + "/reference.json");
  auto orig = load(src), stacked = load(dst);
  const PromptRun a = run_reference_prompt(*orig, ref), b = run_reference_prompt(*stacked, ref);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  // Same weights, same kernels, same order of operations: the logits are bit-identical.
  for (size_t i = 0; i < a.logits.size(); ++i) ASSERT_EQ(a.logits[i], b.logits[i]) << "logit " << i;
  EXPECT_EQ(b.greedy, ref["greedy_ids"].get<std::vector<int32_t>>());
}

namespace {

// Distance of quantized logits y from float logits x over the prompt positions.
struct Closeness {
  int agree = 0, n = 0;     // positions whose argmax matches
  double mean_kl = 0;       // mean KL(softmax x || softmax y), nats
  double rel_rms = 0;       // ||y - x|| / ||x - mean_row(x)||
};

Closeness closeness(const std::vector<float>& xs, const std::vector<float>& ys, int V) {
  Closeness c;
  c.n = static_cast<int>(xs.size()) / V;
  double num = 0, den = 0;
  for (int p = 0; p < c.n; ++p) {
    const float* x = xs.data() + p * V;
    const float* y = ys.data() + p * V;
    c.agree += (std::max_element(x, x + V) - x) == (std::max_element(y, y + V) - y);
    const double mx = *std::max_element(x, x + V), my = *std::max_element(y, y + V);
    double zx = 0, zy = 0, mean = 0;
    for (int v = 0; v < V; ++v) zx += std::exp(x[v] - mx), zy += std::exp(y[v] - my), mean += x[v];
    mean /= V;
    for (int v = 0; v < V; ++v) {
      const double lp = x[v] - mx - std::log(zx), lq = y[v] - my - std::log(zy);
      c.mean_kl += std::exp(lp) * (lp - lq);
      num += (static_cast<double>(y[v]) - x[v]) * (static_cast<double>(y[v]) - x[v]);
      den += (x[v] - mean) * (x[v] - mean);
    }
  }
  c.mean_kl /= c.n;
  c.rel_rms = std::sqrt(num / den);
  return c;
}

}  // namespace

TEST_P(StackedMoe, QuantizedStaysCloseToFloat) {
  // The stacked quantized folders run and stay close to the float model over the 32 reference
  // prompt positions. These are random-weight models (near-Gaussian weights: the worst case for
  // 4 bits; nearly flat next-token distributions, so top-1 flips easily), hence two gates:
  //   8-bit g32: top-1 agreement >= 90%, mean KL < 0.002 nats (measured: 31/32, ~4e-4);
  //   4-bit g32: mean KL < 0.1 nats, relative RMS logit error < 0.75 (measured: KL 0.017 / 0.057,
  //              error 0.28 / 0.53 for qwen3_moe / mixtral), and more KL than 8-bit.
  const std::string name = GetParam(), src = std::string(KILN_SHARED_DIR) + "/models/" + name;
  Json ref = read_json_file(src + "/reference.json");
  auto orig = load(src);
  const PromptRun base = run_reference_prompt(*orig, ref);
  const int V = orig->cfg.vocab_size;
  Closeness by_bits[2];
  for (int i = 0; i < 2; ++i) {
    const int bits = i == 0 ? 8 : 4;
    TempDir tmp(name + "_q" + std::to_string(bits));
    auto q = load(convert_moe(name, tmp.path / "q", bits));
    ASSERT_TRUE(q->cfg.quant);
    const PromptRun r = run_reference_prompt(*q, ref);
    for (float v : r.logits) ASSERT_TRUE(std::isfinite(v));
    by_bits[i] = closeness(base.logits, r.logits, V);
    const Closeness& c = by_bits[i];
    std::printf("%s %d-bit g32 stacked: top-1 agreement %d/%d, mean KL %.5f, relative RMS error %.4f\n", name.c_str(),
                bits, c.agree, c.n, c.mean_kl, c.rel_rms);
  }
  EXPECT_GE(by_bits[0].agree * 10, by_bits[0].n * 9);
  EXPECT_LT(by_bits[0].mean_kl, 0.002);
  EXPECT_LT(by_bits[1].mean_kl, 0.1);
  EXPECT_LT(by_bits[1].rel_rms, 0.75);
  EXPECT_GT(by_bits[1].mean_kl, by_bits[0].mean_kl);
}

INSTANTIATE_TEST_SUITE_P(Moe, StackedMoe, ::testing::Values("tiny-qwen3_moe", "tiny-mixtral"), [](const auto& info) {
  return info.param == "tiny-mixtral" ? std::string("mixtral") : std::string("qwen3_moe");
});

TEST(StackedMoe, MalformedStackedFoldersFail) {
  TempDir tmp("bad_moe");
  const std::string dst = convert_moe("tiny-qwen3_moe", tmp.path / "q", 4);
  // A per-module entry that disagrees with the stored switch_mlp tensors (8 bits for 4-bit codes).
  Json cfg = read_json_file(dst + "/config.json");
  cfg["quantization"]["model.layers.1.mlp.switch_mlp.up_proj"] = {{"bits", 8}, {"group_size", 32}};
  cfg.erase("quantization_config");
  std::ofstream(dst + "/config.json") << cfg.dump();
  try {
    load(dst);
    FAIL() << "loaded 4-bit switch_mlp codes as 8-bit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("switch_mlp.up_proj"), std::string::npos) << e.what();
  }
}

TEST(StackedMoe, QuantizedPerExpertFolderIsReLaidOutExactly) {
  // A quantized folder in the per-expert layout (as kiln wrote MoE folders before): every 2-D weight
  // 4-bit g32, layer 0's expert down_proj at 8 bits through per-expert config entries. A plain
  // `kiln convert` (no -q/-d) stacks the codes as they are and merges those entries into one for
  // switch_mlp.down_proj; both folders give bit-identical logits.
  const std::string src = std::string(KILN_SHARED_DIR) + "/models/tiny-qwen3_moe";
  TempDir tmp("per_expert_q");
  const std::string per_expert = (tmp.path / "pe").string(), stacked = (tmp.path / "st").string();
  io::WeightSet ws = io::WeightSet::open_dir(src);
  Json cfg = read_json_file(src + "/config.json");
  cfg["quantization"] = {{"group_size", 32}, {"bits", 4}, {"mode", "affine"}};
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& name : ws.names()) {
    const Tensor& t = ws.get(name);
    if (!name.ends_with(".weight") || t.ndim() != 2) {
      tensors.emplace_back(name, t);
      continue;
    }
    const std::string mod = name.substr(0, name.size() - 7);
    const bool eight = mod.starts_with("model.layers.0.mlp.experts.") && mod.ends_with(".down_proj");
    if (eight) cfg["quantization"][mod] = {{"group_size", 32}, {"bits", 8}, {"mode", "affine"}};
    quant::QuantizedMatrix q = quant::quantize(t, eight ? 8 : 4, 32, t.dtype);
    tensors.emplace_back(mod + ".weight", q.weight);
    tensors.emplace_back(mod + ".scales", q.scales);
    tensors.emplace_back(mod + ".biases", q.biases);
  }
  fs::create_directories(per_expert);
  io::write_safetensors_dir(per_expert, tensors);
  std::ofstream(per_expert + "/config.json") << cfg.dump(2);
  fs::copy_file(src + "/tokenizer.json", per_expert + "/tokenizer.json");

  quant::ConvertOptions o;
  o.hf_path = per_expert;
  o.mlx_path = stacked;
  EXPECT_EQ(quant::convert(o).n_stacked, 9u);
  Json out_cfg = read_json_file(stacked + "/config.json");
  EXPECT_EQ(out_cfg["quantization"]["model.layers.0.mlp.switch_mlp.down_proj"]["bits"], 8);
  EXPECT_FALSE(out_cfg["quantization"].contains("model.layers.0.mlp.experts.0.down_proj"));
  EXPECT_EQ(io::WeightSet::open_dir(stacked).get("model.layers.0.mlp.switch_mlp.down_proj.weight").shape,
            (Shape{8, 64, 32 * 8 / 32}));

  Json ref = read_json_file(src + "/reference.json");
  auto a = load(per_expert), b = load(stacked);
  const PromptRun ra = run_reference_prompt(*a, ref), rb = run_reference_prompt(*b, ref);
  ASSERT_EQ(ra.logits.size(), rb.logits.size());
  for (size_t i = 0; i < ra.logits.size(); ++i) ASSERT_EQ(ra.logits[i], rb.logits[i]) << "logit " << i;
  EXPECT_EQ(ra.greedy, rb.greedy);
}
