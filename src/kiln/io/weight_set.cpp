// WeightSet: every tensor of a model folder, from model.safetensors, or from
// model.safetensors.index.json and the shards it names, or from all *.safetensors files.
// Names are unique across files; the index must agree with the shards.
#include <algorithm>
#include <filesystem>

#include "kiln/base/error.h"
#include "kiln/base/json.h"
#include "kiln/io/safetensors.h"

namespace kiln::io {
namespace fs = std::filesystem;

namespace {

// A shard name from an index must stay inside the model folder.
bool safe_relative(const std::string& name) {
  fs::path p(name);
  if (name.empty() || p.is_absolute()) return false;
  for (const auto& part : p)
    if (part == "..") return false;
  return true;
}

void add_from_index(WeightSet& w, const fs::path& dir, const fs::path& index_path) {
  const std::string where = index_path.string();
  Json j = read_json_file(where, "weights");
  auto it = j.is_object() ? j.find("weight_map") : j.end();
  if (it == j.end() || !it->is_object())
    fail("weights", "{}: no \"weight_map\" object (tensor name -> shard file)", where);
  if (it->empty()) fail("weights", "{}: \"weight_map\" lists no tensors", where);

  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensor names
  for (auto e = it->begin(); e != it->end(); ++e) {
    if (!e.value().is_string())
      fail("weights", "{}: weight_map entry for \"{}\" is a JSON {}, expected a shard file name", where, e.key(), e.value().type_name());
    by_shard[e.value().get<std::string>()].push_back(e.key());
  }
  for (const auto& [shard, names] : by_shard) {
    if (!safe_relative(shard)) fail("weights", "{}: shard \"{}\" is not a file name inside the model folder", where, shard);
    fs::path p = dir / shard;
    std::error_code ec;
    if (!fs::is_regular_file(p, ec))
      fail("weights", "{}: names shard \"{}\" which does not exist ({}); the download is incomplete", where, shard, p.string());
    SafetensorsFile f = SafetensorsFile::open(p.string());
    for (const auto& name : names)
      if (!f.tensors().count(name))
        fail("weights", "{}: maps tensor \"{}\" to {} but that shard does not contain it", where, name, shard);
    w.add(std::move(f));
  }
}

}  // namespace

WeightSet WeightSet::open_dir(const std::string& dir) {
  std::error_code ec;
  fs::path d(dir);
  if (!fs::is_directory(d, ec))
    fail("weights", "{}: {}", dir, fs::exists(d, ec) ? "not a folder" : "no such folder");
  WeightSet w;
  w.dir_ = dir;

  fs::path index = d / "model.safetensors.index.json";
  fs::path single = d / "model.safetensors";
  if (fs::exists(index, ec)) {
    add_from_index(w, d, index);
  } else if (fs::exists(single, ec)) {
    w.add(SafetensorsFile::open(single.string()));
  } else {
    // Loose files (e.g. mlx "weights.00.safetensors"), in name order for stable errors.
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) files.push_back(e.path());
    if (files.empty())
      fail("weights", "{}: no model.safetensors, model.safetensors.index.json or other *.safetensors file in this folder", dir);
    std::sort(files.begin(), files.end());
    for (const auto& p : files) w.add(SafetensorsFile::open(p.string()));
  }
  return w;
}

void WeightSet::add(SafetensorsFile f) {
  if (dir_.empty()) dir_ = f.path();
  // Check every name before inserting any, so a failed add leaves the set unchanged.
  for (const auto& [name, t] : f.tensors()) {
    auto s = sources_.find(name);
    if (s != sources_.end())
      fail("weights", "{}: tensor \"{}\" appears in both {} and {}", dir_, name, s->second, f.path());
  }
  for (const auto& [name, t] : f.tensors()) {
    tensors_.emplace(name, t);
    sources_.emplace(name, f.path());
  }
}

const Tensor* WeightSet::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const Tensor& WeightSet::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("weights", "{}: missing tensor {}", dir_, name);
  return it->second;
}

std::vector<std::string> WeightSet::names() const {
  std::vector<std::string> r;
  r.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) r.push_back(name);
  return r;
}

std::string WeightSet::source(const std::string& name) const {
  auto it = sources_.find(name);
  return it == sources_.end() ? std::string() : it->second;
}

}  // namespace kiln::io
