// kiln synth: writes a random-weight model folder of a named shape (the shapes of
// ../shared/bench/shapes.json), with the stories260K tokenizer, for benchmarks.
// Values: uniform with the std of HF's initializer (0.02); norms 1. Throughput does not depend on them.
// With --q-bits, every Linear and the embedding are written quantized in the MLX affine layout
// (docs/quantization.md) as `kiln convert -q` writes them: random codes, one scale and bias per
// tensor spanning the same uniform range (seconds, where converting a bf16 8B folder takes minutes).
#include <filesystem>
#include <fstream>

#include "kiln/base/json.h"
#include "kiln/base/thread_pool.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/embedded.h"
#include "kiln/cli/synth_shapes.h"
#include "kiln/io/safetensors.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

// Fills t with uniform values of standard deviation `std` (a counter-based hash: parallel and
// reproducible); u32 tensors get the hash's random words (packed quantized codes).
void fill_random(Tensor& t, float std, uint64_t seed) {
  const float a = std * 1.7320508f;  // uniform on [-a, a] has std a/sqrt(3)
  const int64_t n = t.numel();
  ThreadPool::global().parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint64_t z = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      float u = (static_cast<float>(z >> 40) / 16777216.0f) * 2.0f - 1.0f;
      float v = u * a;
      if (t.dtype == DType::f32) t.ptr<float>()[i] = v;
      else if (t.dtype == DType::u32) t.ptr<uint32_t>()[i] = static_cast<uint32_t>(z);
      else t.ptr<uint16_t>()[i] = f32_to_bf16(v);
    }
  }, 1 << 16);
}

void fill_value(Tensor& t, float v) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype == DType::f32) t.ptr<float>()[i] = v;
    else t.ptr<uint16_t>()[i] = f32_to_bf16(v);
  }
}

void run_synth(const std::string& shape_name, const std::string& out, const std::string& dtype_name_arg, bool force,
               int q_bits, int q_group) {
  const SynthShape& s = synth_shape(shape_name);
  DType dt = dtype_from_name(dtype_name_arg);
  if (dt != DType::f32 && dt != DType::bf16) fail("synth", "--dtype must be bf16 or f32, got \"{}\"", dtype_name_arg);
  if (q_bits != 0 && q_bits != 2 && q_bits != 3 && q_bits != 4 && q_bits != 5 && q_bits != 6 && q_bits != 8)
    fail("synth", "--q-bits must be 2, 3, 4, 5, 6 or 8, got {}", q_bits);
  if (q_group != 32 && q_group != 64 && q_group != 128)
    fail("synth", "--q-group-size must be 32, 64 or 128, got {}", q_group);
  if (fs::exists(out) && !fs::is_empty(out) && !force)
    fail("synth", "{} exists and is not empty; choose another --out or pass --force", out);
  fs::create_directories(out);

  const int64_t hd = s.head_dim ? s.head_dim : s.hidden_size / s.num_attention_heads;
  const int64_t q_out = s.num_attention_heads * hd, kv_out = s.num_key_value_heads * hd, D = s.hidden_size;
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint64_t seed = 1;
  auto add = [&](const std::string& name, Shape shape, bool ones = false) {
    if (q_bits && shape.size() == 2 && shape[1] % q_group == 0) {  // a quantized Linear / embedding
      const std::string base = name.substr(0, name.size() - std::string("weight").size());
      Tensor w = Tensor::host(DType::u32, {shape[0], shape[1] * q_bits / 32});
      fill_random(w, 0.0f, seed++ * 0x100000001B3ull);
      Tensor sc = Tensor::host(dt, {shape[0], shape[1] / q_group}), bi = Tensor::host(dt, sc.shape);
      const float a = 0.02f * 1.7320508f;  // codes 0 .. 2^bits - 1 span [-a, a]
      fill_value(sc, 2.0f * a / static_cast<float>((1 << q_bits) - 1));
      fill_value(bi, -a);
      tensors.emplace_back(name, std::move(w));
      tensors.emplace_back(base + "scales", std::move(sc));
      tensors.emplace_back(base + "biases", std::move(bi));
      return;
    }
    Tensor t = Tensor::host(dt, std::move(shape));
    if (ones) fill_value(t, 1.0f);
    else fill_random(t, 0.02f, seed++ * 0x100000001B3ull);
    tensors.emplace_back(name, std::move(t));
  };
  add("model.embed_tokens.weight", {s.vocab_size, D});
  for (int i = 0; i < s.num_hidden_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {D}, true);
    add(p + "self_attn.q_proj.weight", {q_out, D});
    add(p + "self_attn.k_proj.weight", {kv_out, D});
    add(p + "self_attn.v_proj.weight", {kv_out, D});
    if (s.model_type == "qwen2") {
      add(p + "self_attn.q_proj.bias", {q_out});
      add(p + "self_attn.k_proj.bias", {kv_out});
      add(p + "self_attn.v_proj.bias", {kv_out});
    }
    if (s.model_type == "qwen3") {
      add(p + "self_attn.q_norm.weight", {hd}, true);
      add(p + "self_attn.k_norm.weight", {hd}, true);
    }
    add(p + "self_attn.o_proj.weight", {D, q_out});
    add(p + "post_attention_layernorm.weight", {D}, true);
    add(p + "mlp.gate_proj.weight", {s.intermediate_size, D});
    add(p + "mlp.up_proj.weight", {s.intermediate_size, D});
    add(p + "mlp.down_proj.weight", {D, s.intermediate_size});
  }
  add("model.norm.weight", {D}, true);
  if (!s.tie_word_embeddings) add("lm_head.weight", {s.vocab_size, D});
  std::fprintf(stderr, "synth: writing %s (%s, %s)\n", out.c_str(), shape_name.c_str(), dtype_name(dt));
  io::write_safetensors_dir(out, tensors, {{"format", "pt"}});

  Json cfg = {
      {"architectures", {s.model_type == "llama" ? "LlamaForCausalLM" : s.model_type == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"}},
      {"model_type", s.model_type},
      {"hidden_size", s.hidden_size},
      {"num_hidden_layers", s.num_hidden_layers},
      {"num_attention_heads", s.num_attention_heads},
      {"num_key_value_heads", s.num_key_value_heads},
      {"head_dim", hd},
      {"intermediate_size", s.intermediate_size},
      {"vocab_size", s.vocab_size},
      {"max_position_embeddings", 32768},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", s.rope_theta},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", s.tie_word_embeddings},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"torch_dtype", dt == DType::bf16 ? "bfloat16" : "float32"},
  };
  if (q_bits) {
    const Json q = {{"group_size", q_group}, {"bits", q_bits}, {"mode", "affine"}};
    cfg["quantization"] = q;
    cfg["quantization_config"] = q;
  }
  std::ofstream(fs::path(out) / "config.json") << cfg.dump(2) << "\n";
  std::ofstream(fs::path(out) / "generation_config.json") << Json({{"bos_token_id", 1}, {"eos_token_id", 2}}).dump(2) << "\n";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    auto sv = embedded_model_files().at(f);
    std::ofstream(fs::path(out) / f, std::ios::binary).write(sv.data(), static_cast<std::streamsize>(sv.size()));
  }
  std::fprintf(stderr, "synth: done\n");
}

}  // namespace

void add_synth(CLI::App& app) {
  auto shape = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("bf16");
  auto force = std::make_shared<bool>(false);
  auto q_bits = std::make_shared<int>(0);
  auto q_group = std::make_shared<int>(64);
  std::string names;
  for (auto& s : synth_shapes()) names += (names.empty() ? "" : ", ") + s.name;
  CLI::App* cmd = app.add_subcommand("synth", "Write a random-weight model folder of a named shape (for benchmarks)");
  cmd->add_option("--shape", *shape, "Shape name: " + names)->required();
  cmd->add_option("--out", *out, "Output folder")->required();
  cmd->add_option("--dtype", *dtype, "Weight dtype: bf16 or f32")->capture_default_str();
  cmd->add_flag("--force", *force, "Write into a folder that is not empty");
  cmd->add_option("--q-bits", *q_bits,
                  "Write the Linears and the embedding quantized (MLX affine layout) at this width: 2, 3, 4, 5, 6 "
                  "or 8 (0: not quantized)")
      ->capture_default_str();
  cmd->add_option("--q-group-size", *q_group, "Group size of --q-bits: 32, 64 or 128")->capture_default_str();
  cmd->callback([=] { run_synth(*shape, *out, *dtype, *force, *q_bits, *q_group); });
}

}  // namespace kiln::cli
