// libFuzzer target: arbitrary bytes as a safetensors file (SafetensorsFile::from_mapping).
// Each input either loads, with every tensor view inside the input (every byte is read, so ASan
// flags a view past the end), or fails with a one-line "[safetensors] fuzz.safetensors: ..." error.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kiln/base/error.h"
#include "kiln/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = kiln::MappedFile::from_static(data, size, "fuzz.safetensors");
  try {
    kiln::io::SafetensorsFile f = kiln::io::SafetensorsFile::from_mapping(file);
    uint64_t total = 0;
    for (const auto& [name, t] : f.tensors()) {
      if (t.numel() < 0 || t.nbytes() > size) std::abort();  // a size the data cannot hold
      total += t.nbytes();
      const auto* p = static_cast<const uint8_t*>(t.data);
      uint8_t x = 0;
      for (size_t i = 0; i < t.nbytes(); ++i) x ^= p[i];
      volatile uint8_t sink = x;  // keeps the reads
      (void)sink;
    }
    if (total > size) std::abort();  // ranges were checked not to overlap
  } catch (const kiln::Error& e) {
    const char* what = e.what();
    if (std::strncmp(what, "[safetensors] fuzz.safetensors: ", 32) != 0 || std::strchr(what, '\n')) std::abort();
  }
  return 0;
}
