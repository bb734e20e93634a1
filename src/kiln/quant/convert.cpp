// The convert pipeline (convert.h). Which weights are quantized follows mlx-lm's quantize_model:
// every Linear/Embedding weight (here: every 2-D float `<module>.weight`, and the stacked experts'
// 3-D switch_mlp weights; the families' norms are 1-D) whose input dimension is a multiple of the
// default group size; a recipe, else the model's own rule (recipes.h), picks bits per module and
// records them in config.json; the rest is written as is (cast to --dtype). Per-expert MoE
// checkpoints are written in mlx-lm's stacked switch_mlp layout (moe_layout.h).
#include "kiln/quant/convert.h"

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "kiln/base/json.h"
#include "kiln/io/model_path.h"
#include "kiln/io/safetensors.h"
#include "kiln/quant/affine.h"
#include "kiln/quant/moe_layout.h"
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

// A float weight [..., in] quantized row by row (rows are independent, so a stacked [n_experts,
// out, in] weight is its [n_experts * out, in] view): the outputs keep the leading dimensions.
QuantizedMatrix quantize_nd(const Tensor& w, const QuantParams& p) {
  const int64_t in = w.dim(-1);
  if (in % p.group_size != 0) fail("convert", "input dimension {} is not a multiple of group_size {}", in, p.group_size);
  QuantizedMatrix q = quantize(w.view({w.numel() / in, in}), p.bits, p.group_size, w.dtype);
  Shape lead(w.shape.begin(), w.shape.end() - 1);
  auto with_last = [&](const Tensor& t) {
    Shape s = lead;
    s.push_back(t.dim(1));
    return t.view(s);
  };
  q.weight = with_last(q.weight);
  q.scales = with_last(q.scales);
  q.biases = with_last(q.biases);
  return q;
}

// The inverse for a 2-D or stacked 3-D quantized module at `mod`: w [..., in] in `dtype`.
Tensor dequantize_nd(const Tensor& weight, const Tensor& scales, const Tensor& biases, const QuantParams& p, DType dtype,
                     const std::string& mod) {
  if (weight.ndim() < 2 || scales.ndim() != weight.ndim() || biases.ndim() != weight.ndim() ||
      !std::equal(weight.shape.begin(), weight.shape.end() - 1, scales.shape.begin()) ||
      !std::equal(weight.shape.begin(), weight.shape.end() - 1, biases.shape.begin()))
    fail("convert", "{}: weight {}, scales {} and biases {} do not have the same leading dimensions", mod,
         shape_str(weight.shape), shape_str(scales.shape), shape_str(biases.shape));
  const int64_t rows = weight.numel() / weight.dim(-1);
  QuantizedMatrix q{weight.view({rows, weight.dim(-1)}), scales.view({rows, scales.dim(-1)}),
                    biases.view({rows, biases.dim(-1)}), p.bits, p.group_size};
  check_layout(q.weight, q.scales, q.biases, q.bits, q.group_size, mod);
  Tensor w = dequantize(q, dtype);
  Shape s(weight.shape.begin(), weight.shape.end() - 1);
  s.push_back(w.dim(1));
  return w.view(s);
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
  // Per-expert MoE tensors are written as mlx-lm's stacked switch_mlp modules (moe_layout.h).
  const auto groups = find_expert_groups(names);
  std::map<std::string, const ExpertGroup*> group_of;  // source tensor name -> its group
  if (!groups.empty())
    for (const auto& n : names)
      if (auto e = parse_expert_tensor(n))
        if (auto g = groups.find(e->block + "switch_mlp." + switch_proj_name(e->proj)); g != groups.end())
          group_of[n] = &g->second;
  const std::string model_type = json_get<std::string>(config, "model_type", where).value_or("");

  QuantParams defaults;
  if (opt.bits) defaults.bits = *opt.bits;
  if (opt.group_size) defaults.group_size = *opt.group_size;
  if (opt.quantize) check_params(defaults.bits, defaults.group_size, "kiln convert");
  QuantConfig out_quant(defaults);
  const auto recipe = recipe_from_name(opt.quant_predicate);
  int layer_location = 0, n_layers = 0;
  if (recipe) {
    std::vector<std::string> modules;  // the output's module paths (stacked experts included)
    for (const auto& n : names) {
      auto g = group_of.find(n);
      if (g != group_of.end()) modules.push_back(g->second->stacked);
      else if (auto m = module_of(n); !m.empty()) modules.push_back(m);
    }
    layer_location = recipe_layer_location(modules);
    n_layers = json_get<int>(config, "num_hidden_layers", where).value_or(0);
    if (n_layers <= 0) fail("convert", "{}: num_hidden_layers is needed by --quant-predicate {}", where, recipe->name);
  }

  // The parameters of output module `path` (input dimension `in`) when it is quantized, as mlx-lm's
  // quantize_model decides: a recipe replaces the model's rule (quantize_model uses one or the other).
  auto plan = [&](const std::string& path, int64_t in) -> std::optional<QuantParams> {
    if (in % defaults.group_size != 0) return std::nullopt;  // mlx-lm skips it: float, no entry
    if (recipe) {
      QuantParams p = recipe_params(*recipe, path, layer_location, n_layers, defaults.group_size);
      if (in % p.group_size != 0)
        fail("convert", "{}: input dimension {} is not a multiple of group_size {}", path, in, p.group_size);
      out_quant.set_module(path, p);
      return p;
    }
    if (auto r = model_quant_rule(model_type, path)) {
      // mlx-lm would fail in mx.quantize here; kiln keeps the module float (no entry: it loads as float).
      if (in % r->group_size != 0) return std::nullopt;
      out_quant.set_module(path, *r);
      return r;
    }
    return defaults;
  };
  // Linear/Embedding weights [out, in], and stacked expert weights [n_experts, out, in].
  auto quantizable = [&](const std::string& mod, const Tensor& c) {
    return opt.quantize && !mod.empty() && is_float(c.dtype) &&
           (c.ndim() == 2 || (c.ndim() == 3 && mod.find(".switch_mlp.") != std::string::npos));
  };

  ConvertReport rep;
  double total_bits = 0, total_params = 0;
  std::vector<std::pair<std::string, Tensor>> out;
  auto emit = [&](const std::string& name, Tensor t) {
    total_bits += 8.0 * t.nbytes();
    out.emplace_back(name, std::move(t));
  };

  // One group of per-expert modules -> one stacked module (weight [n_experts, out, ...], and
  // scales/biases [n_experts, out, in / group_size] when quantized, bias [n_experts, out]).
  auto convert_group = [&](const ExpertGroup& g) {
    const size_t n = g.experts.size();
    std::vector<Tensor> w(n), sc, bi, bias;
    std::optional<QuantParams> p, src_p;
    for (size_t e = 0; e < n; ++e) {
      const std::string& m = g.experts[e];
      const Tensor& t = ws.get(m + ".weight");
      if (t.ndim() != 2) fail("convert", "{}.weight has shape {}; an expert's projection must be 2-D", m, shape_str(t.shape));
      if (const Tensor* b = ws.find(m + ".bias")) bias.push_back(target ? cast(*b, *target) : *b);
      std::optional<QuantParams> sp;
      if (src_quant) sp = src_quant->for_module(m, ws.has(m + ".scales"));
      if (e == 0) src_p = sp;
      if (sp.has_value() != src_p.has_value())
        fail("convert", "{}: some experts are quantized and some are not; a stacked module has one setting", g.stacked);
      if (sp) {
        QuantizedMatrix q{t, ws.get(m + ".scales"), ws.get(m + ".biases"), sp->bits, sp->group_size};
        check_layout(q.weight, q.scales, q.biases, q.bits, q.group_size, m);
        total_params += static_cast<double>(t.dim(0)) * q.in_features();
        if (opt.dequantize) {
          w[e] = dequantize(q, target.value_or(q.scales.dtype));
        } else {  // a re-layout of a quantized folder: codes as they are, scales/biases cast
          w[e] = t;
          sc.push_back(target ? cast(q.scales, *target) : q.scales);
          bi.push_back(target ? cast(q.biases, *target) : q.biases);
        }
        continue;
      }
      Tensor c = target ? cast(t, *target) : t;
      total_params += static_cast<double>(c.numel());
      if (e == 0 && quantizable(g.stacked, c)) p = plan(g.stacked, c.dim(1));
      if (p) {
        QuantizedMatrix q = quantize(c, p->bits, p->group_size, c.dtype);
        w[e] = std::move(q.weight);
        sc.push_back(std::move(q.scales));
        bi.push_back(std::move(q.biases));
      } else {
        w[e] = std::move(c);
      }
    }
    if (!bias.empty() && bias.size() != n) fail("convert", "{}: only some experts have a .bias", g.stacked);
    emit(g.stacked + ".weight", stack_tensors(w, g.stacked + ".weight"));
    if (!sc.empty()) {
      emit(g.stacked + ".scales", stack_tensors(sc, g.stacked + ".scales"));
      emit(g.stacked + ".biases", stack_tensors(bi, g.stacked + ".biases"));
    }
    if (!bias.empty()) emit(g.stacked + ".bias", stack_tensors(bias, g.stacked + ".bias"));
    if (!sc.empty()) ++rep.n_quantized;
    else ++rep.n_float;
    ++rep.n_stacked;
  };

  size_t done = 0;
  std::set<const ExpertGroup*> groups_done;
  for (const auto& name : names) {
    if (opt.progress) opt.progress(done, names.size(), name);
    ++done;
    if (auto g = group_of.find(name); g != group_of.end()) {
      if (groups_done.insert(g->second).second) convert_group(*g->second);
      continue;
    }
    const Tensor& t = ws.get(name);
    const std::string mod = module_of(name);
    // Quantized companions are handled with their weight.
    if (opt.dequantize && (name.ends_with(".scales") || name.ends_with(".biases"))) {
      const std::string m = name.substr(0, name.size() - 7);  // both suffixes are 7 characters
      if (ws.has(m + ".weight") && src_quant->for_module(m, ws.has(m + ".scales"))) continue;
    }
    if (opt.dequantize && !mod.empty()) {
      if (auto p = src_quant->for_module(mod, ws.has(mod + ".scales"))) {
        Tensor w = dequantize_nd(t, ws.get(mod + ".scales"), ws.get(mod + ".biases"), *p,
                                 target.value_or(ws.get(mod + ".scales").dtype), mod);
        total_params += static_cast<double>(w.numel());
        emit(name, std::move(w));
        ++rep.n_float;
        continue;
      }
    }
    Tensor c = target ? cast(t, *target) : t;
    if (quantizable(mod, c)) {
      if (auto p = plan(mod, c.dim(-1))) {
        QuantizedMatrix q = quantize_nd(c, *p);
        total_params += static_cast<double>(c.numel());
        emit(mod + ".weight", std::move(q.weight));
        emit(mod + ".scales", std::move(q.scales));
        emit(mod + ".biases", std::move(q.biases));
        ++rep.n_quantized;
        continue;
      }
    }
    if (!mod.empty() && c.ndim() >= 2) ++rep.n_float;
    total_params += static_cast<double>(c.numel());
    emit(name, std::move(c));
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
  } else if (src_quant && !groups.empty()) {  // per-expert entries now name the stacked modules
    for (const char* k : {"quantization", "quantization_config"})
      if (auto it = config.find(k); it != config.end() && it->is_object()) restack_quant_entries(*it, groups);
  }
  if (!groups.empty()) add_mlx_lm_moe_keys(config);
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
