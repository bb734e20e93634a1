// load_model / load_model_from_memory: the same steps for a folder or the embedded files.
#include "kiln/engine/loader.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>

#include "kiln/backend/kv_quant.h"
#include "kiln/base/mapped_file.h"
#include "kiln/io/model_path.h"
#include "kiln/kvstore/identity.h"

namespace kiln::engine {

static std::unique_ptr<backend::Backend> make_backend(const LoadOptions& opt) {
  if (opt.device == "cpu") return backend::make_cpu_backend();
  if (opt.device == "cuda") {
    if (!backend::cuda_device_available())
      fail("engine", "--device cuda: no usable CUDA device (or this build has no CUDA); use --device cpu");
    return backend::make_cuda_backend(0);
  }
  fail("engine", "unknown device \"{}\" (supported: cpu, cuda)", opt.device);
}

// Device backends get every weight once, at load, with a progress line on stderr for large models
// (the CPU backend reads the mmap in place: a no-op there).
static void upload_weights(LoadedModel& m) {
  if (m.backend->device() == Device::cpu) return;
  const auto names = m.weights.names();
  double total = 0, done = 0;
  for (const auto& n : names) total += static_cast<double>(m.weights.get(n).nbytes());
  const bool show = total > 1e9;
  int shown = -1;
  for (const auto& n : names) {
    const Tensor& t = m.weights.get(n);
    m.backend->prefetch_weight(t);
    done += static_cast<double>(t.nbytes());
    int pct = static_cast<int>(100 * done / total);
    if (show && pct / 10 != shown) {
      shown = pct / 10;
      std::fprintf(stderr, "\r[%s] uploading weights %3d%% (%.1f / %.1f GB)", m.backend->name().c_str(), pct, done / 1e9, total / 1e9);
      if (pct == 100) std::fprintf(stderr, "\n");
    }
  }
}

backend::KvQuant kv_quant_for(const model::ModelConfig& c, const LoadOptions& opt) {
  if (opt.kv_bits == 0) return {};
  if (opt.kv_bits != 4 && opt.kv_bits != 8) fail("engine", "--kv-bits {}: use 8 or 4", opt.kv_bits);
  if (opt.kv_group_size != 32 && opt.kv_group_size != 64 && opt.kv_group_size != 128)
    fail("engine", "--kv-group-size {}: use 32, 64 or 128", opt.kv_group_size);
  return backend::resolve_kv_quant(opt.kv_bits, opt.kv_group_size, c.head_dim);
}

std::string describe_kv_cache(const LoadedModel& m, int requested_group_size) {
  const model::ModelConfig& c = m.model->config();
  const backend::KvQuant& q = c.kv_quant;
  const DType ft = m.backend->act_dtype();
  const int64_t width = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  const size_t per_token = 2 * static_cast<size_t>(c.n_layers) * backend::kv_row_bytes(q, width, dtype_size(ft)),
               float_per_token = 2 * static_cast<size_t>(c.n_layers) * backend::kv_row_bytes({}, width, dtype_size(ft));
  if (!q.on()) return fmt::format("KV cache: {}, {} bytes per token", dtype_name(ft), per_token);
  std::string narrowed = q.group_size != requested_group_size
                             ? fmt::format(" (--kv-group-size {} narrowed to head_dim {})", requested_group_size, c.head_dim)
                             : std::string();
  return fmt::format("KV cache: {}-bit, groups of {}{}: {} bytes per token ({:.1f}% of the {} cache's {})", q.bits,
                     q.group_size, narrowed, per_token,
                     100.0 * static_cast<double>(per_token) / static_cast<double>(float_per_token), dtype_name(ft),
                     float_per_token);
}

static void finish_load(LoadedModel& m, const LoadOptions& opt) {
  m.fingerprint = kvstore::model_fingerprint(m.config, m.weights);
  m.tokenizer_fingerprint = kvstore::tokenizer_fingerprint(*m.tokenizer);
  m.backend = make_backend(opt);
  m.config.kv_quant = kv_quant_for(m.config, opt);
  upload_weights(m);
  m.model = model::create_model(m.config, m.weights, *m.backend);
  if (m.tokenizer->vocab_size() > m.config.vocab_size)
    fail("model", "{}: the tokenizer has {} tokens but config.json's vocab_size is {}", m.path, m.tokenizer->vocab_size(),
         m.config.vocab_size);
}

std::unique_ptr<LoadedModel> load_model(const std::string& arg, const LoadOptions& opt) {
  auto m = std::make_unique<LoadedModel>();
  m->path = io::resolve_model_path(arg);
  m->config = model::ModelConfig::load_dir(m->path);
  m->tokenizer = tokenizer::Tokenizer::load_dir(m->path);
  m->weights = io::WeightSet::open_dir(m->path);
  finish_load(*m, opt);
  return m;
}

std::unique_ptr<LoadedModel> load_model_from_memory(const std::map<std::string, std::string_view>& files,
                                                    const std::string& name, const LoadOptions& opt) {
  auto get = [&](const std::string& f) -> std::string {
    auto it = files.find(f);
    return it == files.end() ? std::string() : std::string(it->second);
  };
  auto m = std::make_unique<LoadedModel>();
  m->path = name;
  m->config = model::ModelConfig::from_json(get("config.json"), get("generation_config.json"), name + "/config.json");
  m->config.dir = name;
  m->tokenizer = tokenizer::Tokenizer::from_json(get("tokenizer.json"), get("tokenizer_config.json"), name + "/tokenizer.json");
  auto st = files.at("model.safetensors");
  m->weights.add(io::SafetensorsFile::from_mapping(MappedFile::from_static(st.data(), st.size(), name + "/model.safetensors")));
  finish_load(*m, opt);
  return m;
}

uint64_t LoadedModel::cache_key() const {
  const uint64_t parts[2] = {fingerprint, tokenizer_fingerprint};
  return XXH3_64bits(parts, sizeof parts);
}

std::vector<int32_t> LoadedModel::eos_ids() const {
  std::vector<int32_t> ids = config.generation.eos_ids;
  if (auto e = tokenizer->eos_id(); e && std::find(ids.begin(), ids.end(), *e) == ids.end()) ids.push_back(*e);
  return ids;
}

}  // namespace kiln::engine
