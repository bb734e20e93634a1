// The convert pipeline (convert.h). Which weights are quantized follows mlx-lm's quantize_model:
// every Linear/Embedding weight (here: every 2-D float `<module>.weight`; the families' norms are
// 1-D) whose input dimension is a multiple of the default group size; a recipe then picks bits per
// module and records them in config.json; the rest is written as is (cast to --dtype).
#include "kiln/quant/convert.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/io/model_path.h"
#include "kiln/io/safetensors.h"
#include "kiln/quant/affine.h"
#include "kiln/quant/quant_config.h"
#include "kiln/quant/recipes.h"

namespace fs = std::filesystem;

namespace kiln::quant {

namespace {

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

Tensor cast(const Tensor& t, DType to) {
  if (t.dtype == to || !is_float(t.dtype)) return t;
  Tensor f = Tensor::host(DType::f32, t.shape);
  to_f32(t.data, t.dtype, f.ptr<float>(), t.numel());
  if (to == DType::f32) return f;
  Tensor r = Tensor::host(to, t.shape);
  uint16_t* d = r.ptr<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = to == DType::bf16 ? f32_to_bf16(f.ptr<float>()[i]) : f32_to_f16(f.ptr<float>()[i]);
  return r;
}

std::string module_of(const std::string& name) {
  const std::string suf = ".weight";
  return name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0
             ? name.substr(0, name.size() - suf.size())
             : std::string();
}

}  // namespace

ConvertReport convert(const ConvertOptions& opt) {
  if (opt.hf_path.empty()) fail("convert", "--hf-path is required (the model folder to convert)");
  if (opt.mlx_path.empty()) fail("convert", "--mlx-path is required (where to write the converted model)");
  if (opt.quantize && opt.dequantize) fail("convert", "choose either -q/--quantize or -d/--dequantize, not both");
  if (!opt.quantize && (opt.bits || opt.group_size || !opt.quant_predicate.empty()))
    fail("convert", "--q-bits, --q-group-size and --quant-predicate need -q/--quantize");
  const std::string src = io::resolve_model_path(opt.hf_path);
  const fs::path dst(opt.mlx_path);
  if (fs::exists(dst) && !opt.overwrite)
    fail("convert", "cannot save to {}: it already exists. Delete it, pick a new --mlx-path, or pass --overwrite.",
         opt.mlx_path);
  if (fs::exists(dst) && fs::equivalent(dst, fs::path(src)))
    fail("convert", "--mlx-path {} is the source folder itself", opt.mlx_path);

  Json config = read_json_file((fs::path(src) / "config.json").string(), "convert");
  const std::string where = (fs::path(src) / "config.json").string();
  const auto src_quant = QuantConfig::from_model_config(config, where);
  if (opt.quantize && src_quant)
    fail("convert", "{} is already quantized; dequantize it first (kiln convert -d) or start from the float model",
         opt.hf_path);
  if (opt.dequantize && !src_quant) fail("convert", "{} is not quantized: nothing to dequantize", opt.hf_path);

  // Target float dtype: --dtype, else config.json's torch_dtype (transformers 4) or dtype (5).
  std::string dtype_name_s = opt.dtype;
  if (dtype_name_s.empty()) {
    for (const char* k : {"torch_dtype", "dtype"})
      if (auto v = config.find(k); v != config.end() && v->is_string()) {
        dtype_name_s = v->get<std::string>();
        break;
      }
  }
  std::optional<DType> target;
  if (dtype_name_s == "float16" || dtype_name_s == "bfloat16" || dtype_name_s == "float32") {
    target = dtype_from_name(dtype_name_s);
    // kiln rounds some constants to the checkpoint dtype (model/layers.h), so the config names the cast.
    config[config.contains("dtype") && !config.contains("torch_dtype") ? "dtype" : "torch_dtype"] = dtype_name_s;
  } else if (!opt.dtype.empty()) {
    fail("convert", "--dtype {} is not one of float16, bfloat16, float32", opt.dtype);
  }

  io::WeightSet ws = io::WeightSet::open_dir(src);
  const std::vector<std::string> names = ws.names();
  QuantParams defaults;
  if (opt.bits) defaults.bits = *opt.bits;
  if (opt.group_size) defaults.group_size = *opt.group_size;
  if (opt.quantize) check_params(defaults.bits, defaults.group_size, "kiln convert");
  QuantConfig out_quant(defaults);
  const auto recipe = recipe_from_name(opt.quant_predicate);
  int layer_location = 0, n_layers = 0;
  if (recipe) {
    std::vector<std::string> modules;
    for (const auto& n : names)
      if (auto m = module_of(n); !m.empty()) modules.push_back(m);
    layer_location = recipe_layer_location(modules);
    n_layers = json_get<int>(config, "num_hidden_layers", where).value_or(0);
    if (n_layers <= 0) fail("convert", "{}: num_hidden_layers is needed by --quant-predicate {}", where, recipe->name);
  }

  ConvertReport rep;
  double total_bits = 0, total_params = 0;
  std::vector<std::pair<std::string, Tensor>> out;
  size_t done = 0;
  for (const auto& name : names) {
    if (opt.progress) opt.progress(done, names.size(), name);
    ++done;
    const Tensor& t = ws.get(name);
    const std::string mod = module_of(name);
    // Quantized companions are handled with their weight.
    if (opt.dequantize && (name.ends_with(".scales") || name.ends_with(".biases"))) {
      const std::string m = name.substr(0, name.size() - 7);  // both suffixes are 7 characters
      if (ws.has(m + ".weight") && src_quant->for_module(m, ws.has(m + ".scales"))) continue;
    }
    if (opt.dequantize && !mod.empty()) {
      if (auto p = src_quant->for_module(mod, ws.has(mod + ".scales"))) {
        QuantizedMatrix q{t, ws.get(mod + ".scales"), ws.get(mod + ".biases"), p->bits, p->group_size};
        check_layout(q.weight, q.scales, q.biases, q.bits, q.group_size, mod);
        Tensor w = dequantize(q, target.value_or(q.scales.dtype));
        total_bits += 8.0 * w.nbytes();
        total_params += w.numel();
        out.emplace_back(name, std::move(w));
        ++rep.n_float;
        continue;
      }
    }
    Tensor c = target ? cast(t, *target) : t;
    if (opt.quantize && !mod.empty() && c.ndim() == 2 && is_float(c.dtype) && c.dim(1) % defaults.group_size == 0) {
      QuantParams p = defaults;
      if (recipe) {
        p = recipe_params(*recipe, mod, layer_location, n_layers, defaults.group_size);
        out_quant.set_module(mod, p);
      }
      if (c.dim(1) % p.group_size != 0)
        fail("convert", "{}: input dimension {} is not a multiple of group_size {}", mod, c.dim(1), p.group_size);
      QuantizedMatrix q = quantize(c, p.bits, p.group_size, c.dtype);
      total_bits += 8.0 * (q.weight.nbytes() + q.scales.nbytes() + q.biases.nbytes());
      total_params += static_cast<double>(c.numel());
      out.emplace_back(mod + ".weight", std::move(q.weight));
      out.emplace_back(mod + ".scales", std::move(q.scales));
      out.emplace_back(mod + ".biases", std::move(q.biases));
      ++rep.n_quantized;
      continue;
    }
    if (!mod.empty() && c.ndim() == 2) ++rep.n_float;
    total_bits += 8.0 * c.nbytes();
    total_params += static_cast<double>(c.numel());
    out.emplace_back(name, std::move(c));
  }
  if (opt.progress) opt.progress(names.size(), names.size(), "");
  if (opt.quantize && rep.n_quantized == 0)
    fail("convert", "no weight of {} could be quantized with group_size {} (input dimensions must be multiples of it)",
         opt.hf_path, defaults.group_size);
  rep.bits_per_weight = total_params > 0 ? total_bits / total_params : 0;

  if (opt.quantize) {
    config["quantization"] = out_quant.to_json();
    config["quantization_config"] = config["quantization"];
  } else if (opt.dequantize) {
    config.erase("quantization");
    config.erase("quantization_config");
  }
  fs::create_directories(dst);
  io::write_safetensors_dir(dst.string(), out, {{"format", "mlx"}}, opt.max_shard_bytes);
  {
    std::ofstream f(dst / "config.json");
    f << config.dump(4) << "\n";  // nlohmann objects are key-sorted, as mlx-lm's save_config writes them
    if (!f) fail("convert", "cannot write {}", (dst / "config.json").string());
  }
  // Tokenizer, generation config, chat templates, vocab files: copied as they are.
  for (const auto& e : fs::directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string fn = e.path().filename().string();
    if (fn == "config.json" || fn.ends_with(".safetensors") || fn == "model.safetensors.index.json") continue;
    if (fn == "reference.json" || fn.ends_with(".bin") || fn.ends_with(".pt") || fn.ends_with(".pth")) continue;
    fs::copy_file(e.path(), dst / fn, fs::copy_options::overwrite_existing);
  }
  for (const auto& e : fs::directory_iterator(dst))
    if (e.is_regular_file()) rep.bytes_written += fs::file_size(e.path());
  return rep;
}

}  // namespace kiln::quant
