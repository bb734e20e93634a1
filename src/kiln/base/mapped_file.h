// A read-only view of a whole file: memory-mapped from disk, or borrowed bytes that live for
// the whole program (the embedded default model). Shared so tensors can keep it alive.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kiln {

class MappedFile {
 public:
  // Maps `path` read-only; throws kiln::Error("[io] ...") naming the file when it cannot.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  // Wraps static bytes (not copied, not freed); `name` is used in error messages.
  static std::shared_ptr<MappedFile> from_static(const void* data, size_t size, std::string name);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::string path_;
};

// Reads a whole text file; throws kiln::Error("[component] cannot read PATH: reason").
std::string read_file(const std::string& path, const std::string& component = "io");

}  // namespace kiln
