// Prompt cache files and the SSD tier with stories260K on the device KILN_KV_DEVICE (suite
// KILN_KV_SUITE: kv_files_test.cpp on the CPU, cuda_kv_files_test.cpp on CUDA, skipped without a
// GPU). The oracle is single-shot generation: greedy output after loading a cache file (made with
// another block size, too) equals generating over the same prompt + continuation from scratch;
// a second engine on the same SSD folder (a restarted server) reads the first one's blocks back
// (>= 90% of the prompt) and generates the same tokens as cold; a corrupted or truncated block
// file is rejected and the output is still right. Quantized caches (--kv-bits 8 / 4): the same
// oracles in quantized form (the file holds codes/scales/biases triples, mlx-lm's "{l}.{k}.{j}"
// keys), a file of other bits or group size refused naming both, and float and quantized engines
// never sharing SSD folders.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

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

// stories260K with a float KV cache (kv_bits 0) or one quantized at kv_bits (groups of 8 = its head_dim).
LoadedModel& stories(int kv_bits = 0) {
  static std::map<int, std::unique_ptr<LoadedModel>> models;
  std::unique_ptr<LoadedModel>& m = models[kv_bits];
  if (!m) {
    const char* e = std::getenv("KILN_SHARED_DIR");
    m = load_model(std::string(e ? e : KILN_SHARED_DIR) + "/models/stories260K",
                   {.device = KILN_KV_DEVICE, .kv_bits = kv_bits});
  }
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

EngineConfig config(int block_size, const std::string& ssd_dir = "") {  // (the key is the same for every kv_bits)
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

namespace {

// cache-prompt's steps on the model of kv_bits: prefill only, export the full blocks, save.
kvstore::PromptCache make_prompt_cache(int kv_bits, const std::vector<int32_t>& prompt, const std::string& path) {
  LoadedModel& m = stories(kv_bits);
  Engine eng(*m.model, config(16));
  generate(eng, prompt, 0);
  kvstore::PromptCache pc;
  pc.model = "stories260K";
  pc.model_fingerprint = m.fingerprint;
  pc.tokenizer_fingerprint = m.tokenizer_fingerprint;
  pc.tokens = prompt;
  pc.layout = kvstore::KvLayout::of(eng.kv_cache());
  pc.n_layers = m.config.n_layers;
  pc.n_blocks = eng.export_prefix(prompt, pc.data);
  kvstore::save_prompt_cache(path, pc);
  return pc;
}

}  // namespace

TEST_F(KILN_KV_SUITE, QuantizedCacheFileRoundTripsAndRefusesOtherBits) {
  const std::vector<int32_t> prompt = encode(kStory);
  std::vector<int32_t> all = prompt, cont = stories().tokenizer->encode(", Lily woke up and", false);
  all.insert(all.end(), cont.begin(), cont.end());
  for (int bits : {8, 4}) {
    SCOPED_TRACE(fmt::format("kv_bits {}", bits));
    const std::string path = (dir_ / fmt::format("q{}.safetensors", bits)).string();
    make_prompt_cache(bits, prompt, path);
    // The file: per layer K and V triples (u32 codes, f16 scales, f16 biases) under mlx-lm's keys.
    const io::SafetensorsFile f = io::SafetensorsFile::open(path);
    const int64_t width = 4 * 8, rows = static_cast<int64_t>(prompt.size()) / 16 * 16;  // 4 kv heads x 8
    EXPECT_EQ(f.tensors().size(), 6u * stories().config.n_layers);
    for (const char* k : {"0.0.0", "4.1.0"}) {
      ASSERT_TRUE(f.tensors().count(k)) << k;
      EXPECT_EQ(f.tensors().at(k).dtype, DType::u32);
      EXPECT_EQ(f.tensors().at(k).shape, (Shape{rows, width * bits / 32}));
    }
    for (const char* k : {"0.0.1", "2.1.2"}) {
      ASSERT_TRUE(f.tensors().count(k)) << k;
      EXPECT_EQ(f.tensors().at(k).dtype, DType::f16);
      EXPECT_EQ(f.tensors().at(k).shape, (Shape{rows, width / 8}));
    }
    EXPECT_EQ(f.metadata().at("kv_bits"), std::to_string(bits));
    EXPECT_EQ(f.metadata().at("kv_group_size"), "8");

    // Greedy after loading it (into blocks of 16 and of 8) equals single-shot over the same cache.
    Engine cold(*stories(bits).model, config(16));
    const Output expect = generate(cold, all, 40);
    const kvstore::PromptCache pc = kvstore::load_prompt_cache(path);
    for (int bs : {16, 8}) {
      Engine eng(*stories(bits).model, config(bs));
      const kvstore::KvLayout layout = kvstore::KvLayout::of(eng.kv_cache());
      kvstore::check_prompt_cache_layout(pc, path, layout);
      int n = 0;
      const auto data = kvstore::reblock(pc, layout, n);
      EXPECT_EQ(eng.import_prefix(pc.tokens, n, data), n);
      const Output got = generate(eng, all, 40);
      EXPECT_EQ(got.n_cached, n * bs) << "block size " << bs;
      EXPECT_EQ(got.tokens, expect.tokens) << "block size " << bs;
    }
    // Another cache's layout is refused, naming both.
    for (int other : {0, 12 - bits}) {
      Engine eng(*stories(other).model, config(16));
      try {
        kvstore::check_prompt_cache_layout(pc, path, kvstore::KvLayout::of(eng.kv_cache()));
        ADD_FAILURE() << "a " << bits << "-bit file accepted by a cache of kv_bits " << other;
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(fmt::format("--kv-bits {} --kv-group-size 8", bits)), std::string::npos) << msg;
        EXPECT_NE(msg.find(other ? fmt::format("--kv-bits {}", other) : std::string("in float (no --kv-bits)")), std::string::npos)
            << msg;
      }
    }
  }
}

TEST_F(KILN_KV_SUITE, QuantizedSsdTierRoundTripsAndNeverSharesFloatFolders) {
  const std::vector<int32_t> prompt = encode(kStory);
  Output cold;
  {
    Engine eng(*stories(8).model, config(16, dir_.string()));
    cold = generate(eng, prompt, 30);
    const Output again = generate(eng, prompt, 30);  // the in-memory prefix cache, quantized blocks shared
    EXPECT_GE(again.n_cached, static_cast<int>(prompt.size()) - 16);
    EXPECT_EQ(again.tokens, cold.tokens);
  }
  {  // a restarted 8-bit server reads its blocks back: the same tokens as cold
    Engine eng(*stories(8).model, config(16, dir_.string()));
    const Output warm = generate(eng, prompt, 30);
    EXPECT_GE(warm.n_cached, static_cast<int>(0.9 * prompt.size()));
    EXPECT_EQ(warm.n_cached_ssd, warm.n_cached);
    EXPECT_EQ(warm.tokens, cold.tokens);
  }
  for (int other : {0, 4}) {  // a float or 4-bit server on the same folder finds none of them
    Engine eng(*stories(other).model, config(16, dir_.string()));
    const Output got = generate(eng, prompt, 5);
    EXPECT_EQ(got.n_cached_ssd, 0) << "kv_bits " << other;
    EXPECT_EQ(eng.ssd()->stats().hits, 0) << "kv_bits " << other;
  }
  int folders = 0;  // one per layout, side by side
  for (auto& e : fs::directory_iterator(dir_)) folders += e.is_directory();
  EXPECT_EQ(folders, 3);
}
