// The shape table for kiln synth.
#include "kiln/cli/synth_shapes.h"

#include "kiln/base/error.h"

namespace kiln::cli {

const std::vector<SynthShape>& synth_shapes() {
  static const std::vector<SynthShape> shapes = {
      {"tiny", "llama", 64, 2, 4, 2, 128, 512, 10000.0},
      {"llama-100m", "llama", 768, 12, 12, 4, 2048, 32000, 10000.0},
      {"llama-1b", "llama", 2048, 16, 32, 8, 8192, 128256, 500000.0, true},
      {"llama-3-8b", "llama", 4096, 32, 32, 8, 14336, 128256, 500000.0},
      {"qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, 1000000.0},
      {"qwen3-8b", "qwen3", 4096, 36, 32, 8, 12288, 151936, 1000000.0, false, 128},
  };
  return shapes;
}

const SynthShape& synth_shape(const std::string& name) {
  for (auto& s : synth_shapes())
    if (s.name == name) return s;
  std::string names;
  for (auto& s : synth_shapes()) names += (names.empty() ? "" : ", ") + s.name;
  fail("synth", "unknown shape \"{}\" (known: {})", name, names);
}

}  // namespace kiln::cli
