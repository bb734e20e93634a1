// Prompt cache files and the SSD tier with stories260K on the device KILN_KV_DEVICE (suite
// KILN_KV_SUITE: kv_files_test.cpp on the CPU, cuda_kv_files_test.cpp on CUDA, skipped without a
// GPU). The oracle is single-shot generation: greedy output after loading a cache file (made with
// another block size, too) equals generating over the same prompt + continuation from scratch;
// a second engine on the same SSD folder (a restarted server) reads the first one's blocks back
// (>= 90% of the prompt) and generates the same tokens as cold; a corrupted or truncated block
// file is rejected and the output is still right.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kiln/engine/engine.h"
#include "kiln/engine/loader.h"
#include "kiln/kvstore/prompt_file.h"

using namespace kiln;
using namespace kiln::engine;
namespace fs = std::filesystem;

class KILN_KV_SUITE : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(KILN_KV_DEVICE) == "cuda" && !backend::cuda_device_available())
      GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    char tmpl[] = "/tmp/kiln-kvfiles-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

namespace {

LoadedModel& stories() {
  static std::unique_ptr<LoadedModel> m = [] {
    const char* e = std::getenv("KILN_SHARED_DIR");
    return load_model(std::string(e ? e : KILN_SHARED_DIR) + "/models/stories260K", {.device = KILN_KV_DEVICE});
  }();
  return *m;
}

std::vector<int32_t> encode(const std::string& s) { return stories().tokenizer->encode(s, true); }

const std::string kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. "
    "One day, she saw a big red ball under a tree. She ran to the ball and picked it up. Her friend Tom came and "
    "said, \"Can I play with the ball too?\" Lily said yes, and they played together all day. When the sun went "
    "down, they went home happy. The next morning";

struct Output {
  std::vector<int32_t> tokens;
  int n_cached = 0, n_cached_ssd = 0;
};

EngineConfig config(int block_size, const std::string& ssd_dir = "") {
  EngineConfig ec;
  ec.scheduler.max_seqs = 2;
  ec.block_size = block_size;
  ec.n_blocks = 64;
  ec.prompt_cache_bytes = 1 << 20;
  ec.model_key = stories().cache_key();
  ec.ssd.dir = ssd_dir;
  return ec;
}

Output generate(Engine& eng, const std::vector<int32_t>& prompt, int max_tokens) {
  Output out;
  Request r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.on_event = [&](const TokenEvent& e) {
    if (e.token >= 0) out.tokens.push_back(e.token);
    out.n_cached = e.n_cached;
    out.n_cached_ssd = e.n_cached_ssd;
  };
  eng.add(std::move(r));
  while (eng.has_work()) eng.step();
  return out;
}

}  // namespace

TEST_F(KILN_KV_SUITE, GreedyAfterACacheFileEqualsSingleShot) {
  const std::vector<int32_t> prompt = encode(kStory);
  ASSERT_GT(prompt.size(), 64u);
  std::vector<int32_t> cont = stories().tokenizer->encode(", Lily woke up and", false);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), cont.begin(), cont.end());

  // cache-prompt's steps: prefill only, export the full blocks, save.
  const std::string path = (dir_ / "p.safetensors").string();
  {
    Engine eng(*stories().model, config(16));
    generate(eng, prompt, 0);
    kvstore::PromptCache pc;
    pc.model = "stories260K";
    pc.model_fingerprint = stories().fingerprint;
    pc.tokenizer_fingerprint = stories().tokenizer_fingerprint;
    pc.tokens = prompt;
    pc.layout = kvstore::KvLayout::of(eng.kv_cache());
    pc.n_layers = stories().config.n_layers;
    pc.n_blocks = eng.export_prefix(prompt, pc.data);
    EXPECT_EQ(pc.n_blocks, static_cast<int>(prompt.size()) / 16);
    kvstore::save_prompt_cache(path, pc);
  }
  Engine cold(*stories().model, config(16));
  const Output expect = generate(cold, all, 40);
  ASSERT_EQ(expect.n_cached, 0);
  const kvstore::PromptCache pc = kvstore::load_prompt_cache(path);
  for (int bs : {16, 8}) {  // as made, and into chat's smaller blocks
    Engine eng(*stories().model, config(bs));
    kvstore::check_prompt_cache_layout(pc, path, kvstore::KvLayout::of(eng.kv_cache()));
    int n = 0;
    const auto data = kvstore::reblock(pc, kvstore::KvLayout::of(eng.kv_cache()), n);
    EXPECT_EQ(eng.import_prefix(pc.tokens, n, data), n);
    const Output got = generate(eng, all, 40);
    EXPECT_EQ(got.n_cached, n * bs) << "block size " << bs;  // only the rest was computed
    EXPECT_GE(got.n_cached, static_cast<int>(prompt.size()) - 16 - bs);  // (the file's blocks are of 16)
    EXPECT_EQ(got.tokens, expect.tokens) << "block size " << bs;
  }
}

TEST_F(KILN_KV_SUITE, ASecondEngineOnTheSsdFolderReadsTheBlocksBack) {
  const std::vector<int32_t> prompt = encode(kStory);
  Output cold;
  {
    Engine eng(*stories().model, config(16, dir_.string()));
    cold = generate(eng, prompt, 30);
    EXPECT_EQ(cold.n_cached, 0);
  }  // the engine's end writes what is queued (a server's SIGTERM)
  std::vector<fs::path> files;
  for (auto& e : fs::recursive_directory_iterator(dir_))
    if (e.path().extension() == ".kvb") files.push_back(e.path());
  // Every full block of the prompt and of the output so far went to disk.
  EXPECT_EQ(files.size(), (prompt.size() + 30 - 1) / 16);
  {
    Engine eng(*stories().model, config(16, dir_.string()));
    const Output warm = generate(eng, prompt, 30);
    EXPECT_GE(warm.n_cached, static_cast<int>(0.9 * prompt.size()));
    EXPECT_EQ(warm.n_cached_ssd, warm.n_cached);
    EXPECT_EQ(warm.tokens, cold.tokens);
    EXPECT_GT(eng.ssd()->stats().hits, 0);
  }
  // Damaged blocks: the chain's block 3 truncated (found at start-up), block 1 with a flipped K/V
  // byte (found when read): both deleted, the prefix recomputed from block 1, the output unchanged.
  BlockManager chain(1, 16, {1, stories().cache_key()});  // names the files as the engine does
  std::vector<uint64_t> hashes;
  auto file_of = [&](int i) {
    for (const fs::path& f : files)
      if (f.filename().string() == fmt::format("{:016x}.kvb", chain.block_hash(prompt, hashes, i))) return f;
    ADD_FAILURE() << "no file for block " << i;
    return fs::path();
  };
  const fs::path b1 = file_of(1), b3 = file_of(3);
  {
    std::fstream f(b1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(b1) / 2));  // inside the K/V
    f.put('\x7f');
  }
  fs::resize_file(b3, 100);
  {
    Engine eng(*stories().model, config(16, dir_.string()));
    EXPECT_EQ(eng.ssd()->stats().rejected, 1);  // the truncated one, at start-up
    const Output again = generate(eng, prompt, 30);
    EXPECT_EQ(eng.ssd()->stats().rejected, 2);  // the flipped one, when read
    EXPECT_EQ(again.tokens, cold.tokens);
    EXPECT_EQ(again.n_cached, 16);  // block 0 only
  }
}
