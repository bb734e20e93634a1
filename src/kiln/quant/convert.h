// `kiln convert` as mlx_lm.convert: read a model folder, optionally cast its float tensors, quantize
// its Linear/Embedding weights into MLX's affine layout (uniform or a mixed recipe) or dequantize a
// quantized folder, and write DST: safetensors shards (<= 5 GiB each, plus the index), config.json
// with the quantization section, and the tokenizer / generation / template files copied unchanged.
// MoE experts are written in mlx-lm's stacked layout (`...switch_mlp.{gate,up,down}_proj`).
#pragma once
#include <functional>
#include <optional>
#include <string>

namespace kiln::quant {

struct ConvertOptions {
  std::string hf_path;   // source folder (or HF cache repo id)
  std::string mlx_path;  // destination folder; must not exist unless overwrite
  bool quantize = false, dequantize = false, overwrite = false;
  std::optional<int> bits, group_size;  // defaults 4 / 64 (mlx-lm's affine defaults)
  std::string dtype;                    // "" = config.json's torch_dtype/dtype; float16 | bfloat16 | float32
  std::string quant_predicate;          // "" or a recipe name (recipes.h)
  uint64_t max_shard_bytes = uint64_t{5} << 30;  // mlx-lm's MAX_FILE_SIZE_GB << 30
  // Progress: (done, total, tensor name); nullptr = silent.
  std::function<void(size_t, size_t, const std::string&)> progress;
};

struct ConvertReport {
  size_t n_quantized = 0, n_float = 0;  // weight matrices quantized / left in float (a stacked expert module counts once)
  size_t n_stacked = 0;                 // per-expert MoE projections written as stacked switch_mlp modules
  double bits_per_weight = 0;           // bits of all tensors / parameters (mlx-lm's figure)
  uint64_t bytes_written = 0;
};

// Throws [convert] / [quant] with an actionable message on bad options or input.
ConvertReport convert(const ConvertOptions& opt);

}  // namespace kiln::quant
