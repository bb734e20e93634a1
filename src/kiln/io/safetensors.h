// Safetensors files: a validating mmap reader (tensors are zero-copy views into the mapping),
// the set of all tensors of a model folder (single file, sharded with an index, or loose files),
// and a writer (one file, or <= max_shard_bytes shards plus model.safetensors.index.json).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/base/mapped_file.h"
#include "kiln/tensor/tensor.h"

namespace kiln::io {

// One safetensors file, parsed and validated; tensors are zero-copy views into the mapping
// (Tensor.holder keeps it alive). The mapping is read-only: never write through Tensor.data.
// Layout: u64 little-endian header length N, N bytes of JSON header
//   {name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, "__metadata__": {str: str}},
// then the data; offsets are relative to the data start (byte 8 + N).
class SafetensorsFile {
 public:
  // Maps `path`; every problem is a kiln::Error "[safetensors] PATH: ..." (one line).
  static SafetensorsFile open(const std::string& path);
  // Parses bytes already in memory (the embedded model, a fuzz input); errors name file->path().
  static SafetensorsFile from_mapping(std::shared_ptr<MappedFile> file);

  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // "__metadata__"
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder: model.safetensors, or model.safetensors.index.json + its
// shards, or every *.safetensors file when neither exists. Errors ("[weights] ...") when a name
// appears twice or the index names a missing shard or a tensor its shard lacks.
class WeightSet {
 public:
  WeightSet() = default;
  static WeightSet open_dir(const std::string& dir);
  // Merges the tensors of f (used for the embedded model); a name already present is an error.
  void add(SafetensorsFile f);

  const Tensor* find(const std::string& name) const;  // nullptr when absent
  // kiln::Error "[weights] <dir>: missing tensor NAME" when absent.
  const Tensor& get(const std::string& name) const;
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }
  const std::string& dir() const { return dir_; }
  // The file a tensor came from ("" when absent), for error messages.
  std::string source(const std::string& name) const;

 private:
  std::string dir_;  // the folder, or the first added file's path
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> sources_;  // tensor name -> file path
};

// Writes tensors (host memory) to DIR as model.safetensors, or, when their bytes exceed
// max_shard_bytes, as model-0000i-of-0000n.safetensors shards whose tensor bytes are at most
// max_shard_bytes each (a single larger tensor gets a shard of its own, as Hugging Face does),
// plus model.safetensors.index.json. Tensors keep the given order (in the data and in the
// shards). Stale model.safetensors / index / shard files of the other layout are removed.
void write_safetensors_dir(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                           const std::map<std::string, std::string>& metadata = {},
                           uint64_t max_shard_bytes = 5'000'000'000ull);
// Writes one file (via a temporary file renamed into place). The header is padded with spaces
// so the data starts at a multiple of 8 bytes, as Hugging Face's writer does.
void write_safetensors_file(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                            const std::map<std::string, std::string>& metadata = {});

// The safetensors dtype string ("F32", "BF16", ...) of t.
const char* safetensors_dtype_name(DType t);

}  // namespace kiln::io
