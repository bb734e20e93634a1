// --model / --device / KV sizing flags, model loading, and peak memory for --verbose reports.
#include "kiln/cli/model_args.h"

#include <sys/resource.h>

#include <cstdio>

#include "kiln/cli/embedded.h"

namespace kiln::cli {

void ModelArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--model", model,
                  "Model folder or Hugging Face repo id in the local HF cache (default: the embedded stories260K)");
  cmd->add_option("--device", device, "Where to run: auto, cpu or cuda (auto: cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--gpu-memory-utilization", gpu_memory_utilization,
                  "Fraction of the GPU's total memory this process may use: weights, activations and the KV cache, "
                  "which is capped to fit (ignored on the CPU)")
      ->check(CLI::Range(0.01, 1.0))->capture_default_str();
  cmd->add_option("--kv-cache-bytes", kv_cache_bytes,
                  "KV cache size in bytes for running sequences, overriding the fraction (default: what the "
                  "sequences' context needs, within the fraction)");
  cmd->add_option("--kv-bits", kv_bits,
                  "Quantize the KV cache to 8 or 4 bits (affine, per group along each head; default: float)")
      ->check(CLI::IsMember({8, 4}));
  cmd->add_option("--kv-group-size", kv_group_size,
                  "Values per quantization group of the KV cache (narrowed to head_dim when wider)")
      ->check(CLI::IsMember({32, 64, 128}))->capture_default_str();
}

void ModelArgs::add_max_kv_size_to(CLI::App* cmd) {
  cmd->add_option("--max-kv-size", max_kv_size,
                  "Rotating KV cache (mlx-lm's): each token attends to the first 4 tokens and the last N - 4, so a "
                  "long generation holds about N tokens of K/V; N > 4, 0 = off. Blocks past N tokens are not prefix-cached "
                  "(default: off, the whole context)")
      ->check([](const std::string& v) -> std::string {
        int n = 0;
        if (!CLI::detail::lexical_cast(v, n) || n < 0 || (n > 0 && n <= model::kKvKeep))
          return fmt::format("{} is not a whole number more than {} (the first {} tokens are always kept) or 0 (off)", v,
                             model::kKvKeep, model::kKvKeep);
        return "";
      });
}

void ModelArgs::apply_to(engine::EngineConfig& ec) const {
  ec.gpu_memory_utilization = gpu_memory_utilization;
  ec.kv_cache_bytes = kv_cache_bytes;
  ec.max_kv_size = max_kv_size;
}

engine::LoadOptions ModelArgs::load_options() const {
  engine::LoadOptions opt;
  opt.device = device == "auto" ? (backend::cuda_device_available() ? "cuda" : "cpu") : device;
  opt.kv_bits = kv_bits;
  opt.kv_group_size = kv_group_size;
  return opt;
}

std::unique_ptr<engine::LoadedModel> ModelArgs::load() const {
  const engine::LoadOptions opt = load_options();
  std::unique_ptr<engine::LoadedModel> m = model.empty()
                                               ? engine::load_model_from_memory(embedded_model_files(), kEmbeddedName, opt)
                                               : engine::load_model(model, opt);
  if (m->config.kv_quant.on()) std::fprintf(stderr, "%s\n", engine::describe_kv_cache(*m, kv_group_size).c_str());
  return m;
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace kiln::cli
