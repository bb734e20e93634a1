// Tokenizer encode throughput: loads a tokenizer folder and encodes about 100k tokens of the
// shared/fixtures/text corpus as one prompt (cold: first call, word cache empty; warm: repeated),
// then decodes it, printing tokens/s.
// Usage: tokenizer_bench <model-or-tokenizer-dir> [target_tokens=100000] [text_dir=<shared>/fixtures/text]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "kiln/base/error.h"
#include "kiln/base/mapped_file.h"
#include "kiln/tokenizer/tokenizer.h"

#ifndef KILN_SHARED_DIR
#define KILN_SHARED_DIR "../shared"
#endif

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <tokenizer-dir> [target_tokens=100000] [text_dir]\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  long target = argc > 2 ? std::stol(argv[2]) : 100000;
  std::string text_dir = argc > 3 ? argv[3] : std::string(KILN_SHARED_DIR) + "/fixtures/text";
  try {
    auto t0 = std::chrono::steady_clock::now();
    auto tok = kiln::tokenizer::Tokenizer::load_dir(dir);
    std::printf("load        %8.3f s  (%s, vocab %d)\n", seconds_since(t0), dir.c_str(), tok->vocab_size());

    // Corpus: the text files in order, repeated until the target is surely reached, then cut to
    // about `target` tokens using the measured bytes per token.
    std::string corpus;
    for (const auto& e : std::filesystem::directory_iterator(text_dir)) {
      if (e.is_regular_file()) corpus += kiln::read_file(e.path().string(), "bench");
    }
    if (corpus.empty()) kiln::fail("bench", "{}: no text files", text_dir);
    auto sample = tok->encode(std::string_view(corpus).substr(0, 200000), false);
    double bytes_per_token = 200000.0 / std::max<size_t>(sample.size(), 1);
    size_t want = static_cast<size_t>(bytes_per_token * target * 1.02);
    std::string text;
    while (text.size() < want) text += corpus;
    text.resize(want);
    while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();

    // The word cache is shared by encode calls, so a fresh tokenizer gives the cold number.
    tok = kiln::tokenizer::Tokenizer::load_dir(dir);
    t0 = std::chrono::steady_clock::now();
    auto ids = tok->encode(text, true);
    double cold = seconds_since(t0);
    std::printf("encode cold %8.3f s  %zu tokens from %zu bytes  %.0f tokens/s\n", cold, ids.size(), text.size(),
                ids.size() / cold);
    double warm = 1e9;
    for (int r = 0; r < 3; ++r) {
      t0 = std::chrono::steady_clock::now();
      auto again = tok->encode(text, true);
      warm = std::min(warm, seconds_since(t0));
      if (again != ids) kiln::fail("bench", "encode is not deterministic");
    }
    std::printf("encode warm %8.3f s  %.0f tokens/s\n", warm, ids.size() / warm);
    t0 = std::chrono::steady_clock::now();
    std::string back = tok->decode(ids, true);
    double dec = seconds_since(t0);
    std::printf("decode      %8.3f s  %.0f tokens/s  (round trip %s)\n", dec, ids.size() / dec,
                back.size() + 8 >= text.size() ? "ok" : "SHORT");
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
