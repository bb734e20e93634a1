// libFuzzer target: arbitrary bytes as a prompt cache file (kvstore/prompt_file.h, a safetensors
// file with kiln's metadata). Each input is either refused with a kiln::Error or loads into a
// PromptCache whose pieces agree with each other (block count, tokens, data size); what loads is
// then re-blocked to its own layout, which must give its data back.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "kiln/base/error.h"
#include "kiln/kvstore/prompt_file.h"

using namespace kiln;
using namespace kiln::kvstore;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The loader reads a path: the input goes to a per-process file in memory-backed /dev/shm.
  static const std::string path = "/dev/shm/kiln-prompt-cache-fuzz-" + std::to_string(::getpid()) + ".safetensors";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  PromptCache pc;
  try {
    pc = load_prompt_cache(path);
  } catch (const Error&) {
    return 0;  // refused, with a message
  }
  if (pc.n_blocks < 0 || pc.layout.block_size <= 0) std::abort();
  if (pc.data.size() != static_cast<size_t>(pc.n_blocks) * pc.layout.block_bytes) std::abort();
  if (static_cast<size_t>(pc.n_cached_tokens()) > pc.tokens.size()) std::abort();
  int n = 0;
  const std::vector<std::byte> again = reblock(pc, pc.layout, n);
  if (n != pc.n_blocks || again != pc.data) std::abort();
  return 0;
}
