// kiln convert: mlx_lm.convert's flags over quant::convert — quantize a Hugging Face folder into
// MLX's affine layout (uniform --q-bits/--q-group-size or a --quant-predicate recipe), dequantize
// a quantized folder (-d), or just cast (--dtype). Prints a progress bar on stderr and a summary.
#include <unistd.h>

#include <cstdio>
#include <optional>

#include "kiln/cli/commands.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/recipes.h"

namespace kiln::cli {

namespace {

struct ConvertArgs {
  quant::ConvertOptions opt;
  int bits = 0, group_size = 0;  // 0: not given
};

void run_convert(ConvertArgs& a) {
  if (a.bits) a.opt.bits = a.bits;
  if (a.group_size) a.opt.group_size = a.group_size;
  const bool tty = isatty(fileno(stderr));
  int last_pct = -1;
  a.opt.progress = [&](size_t done, size_t total, const std::string& name) {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (tty) {
      const int width = 30, fill = pct * width / 100;
      std::fprintf(stderr, "\r[convert] [%.*s%*s] %3d%% %-48.48s", fill, "==============================",
                   width - fill, "", pct, name.c_str());
      if (done == total) std::fputc('\n', stderr);
    } else if (pct / 10 != last_pct / 10 || done == total) {
      std::fprintf(stderr, "[convert] %3d%% (%zu/%zu tensors)\n", pct, done, total);
    }
    last_pct = pct;
  };
  if (a.opt.quantize)
    std::printf("[INFO] Quantizing %s -> %s\n", a.opt.hf_path.c_str(), a.opt.mlx_path.c_str());
  quant::ConvertReport r = quant::convert(a.opt);
  if (a.opt.quantize)
    std::printf("[INFO] Quantized model with %.3f bits per weight (%zu matrices quantized, %zu left in float).\n",
                r.bits_per_weight, r.n_quantized, r.n_float);
  std::printf("[INFO] Wrote %s (%.1f MB)\n", a.opt.mlx_path.c_str(), static_cast<double>(r.bytes_written) / 1e6);
}

}  // namespace

void add_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a model folder: quantize to MLX's affine layout (-q), "
                                                "dequantize (-d) or cast (--dtype), as mlx_lm.convert");
  cmd->add_option("--hf-path,--model", a->opt.hf_path, "Source model folder (or HF repo id in the local cache)")->required();
  cmd->add_option("--mlx-path", a->opt.mlx_path, "Where to write the converted model")->default_val("mlx_model");
  cmd->add_flag("-q,--quantize", a->opt.quantize, "Quantize the Linear/Embedding weights");
  cmd->add_option("--q-bits", a->bits, "Bits per weight: 2, 3, 4, 5, 6 or 8 (default 4)")
      ->check(CLI::IsMember({2, 3, 4, 5, 6, 8}));
  cmd->add_option("--q-group-size", a->group_size, "Group size: 32, 64 or 128 (default 64)")
      ->check(CLI::IsMember({32, 64, 128}));
  cmd->add_option("--q-mode", [](const CLI::results_t& r) { return r.size() == 1 && r[0] == "affine"; },
                  "Quantization mode (affine only)");
  cmd->add_option("--quant-predicate", a->opt.quant_predicate, "Mixed-bit recipe")
      ->check(CLI::IsMember(quant::recipe_names()));
  cmd->add_option("--dtype", a->opt.dtype, "Type of the float tensors (default: config.json's torch_dtype)")
      ->check(CLI::IsMember({"float16", "bfloat16", "float32"}));
  cmd->add_flag("-d,--dequantize", a->opt.dequantize, "Dequantize a quantized model");
  cmd->add_flag("--force", a->opt.overwrite, "Overwrite --mlx-path when it exists");
  cmd->callback([a] { run_convert(*a); });
}

}  // namespace kiln::cli
