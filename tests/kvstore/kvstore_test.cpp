// kvstore without a model: block files (every field checked, any damage refused), the SSD tier
// (a second instance finds what the first wrote; damaged, truncated, stray and temporary files are
// deleted and counted; the byte budget holds; an unwritable folder degrades without failing), and
// prompt cache files (round trip, re-blocking, and a refusal for each kind of mismatch or damage).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/kvstore/block_file.h"
#include "kiln/kvstore/prompt_file.h"
#include "kiln/kvstore/ssd_cache.h"

using namespace kiln;
using namespace kiln::kvstore;
namespace fs = std::filesystem;

namespace {

// Two layers, K/V [block_size, 8] f32 (a small model's cache layout).
KvLayout layout(int block_size = 4, DType dt = DType::f32, int width = 8) {
  KvLayout l;
  l.block_size = block_size;
  for (int i = 0; i < 4; ++i) {
    PlaneLayout p{dt, {block_size, width}, static_cast<size_t>(block_size * width) * dtype_size(dt)};
    l.block_bytes += p.bytes;
    l.planes.push_back(p);
  }
  return l;
}

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<std::byte> b(n);
  for (auto& x : b) x = static_cast<std::byte>(g() & 0xff);
  return b;
}

std::vector<int32_t> toks(int n, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 5 + (i * 7 + salt) % 200;
  return t;
}

struct TempDir {
  fs::path p;
  TempDir() {
    char tmpl[] = "/tmp/kiln-kvstore-XXXXXX";
    p = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(p, fs::perms::owner_all, fs::perm_options::add, ec);
    for (auto& e : fs::recursive_directory_iterator(p, ec)) fs::permissions(e.path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(p, ec);
  }
};

std::vector<std::byte> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}
void spit(const fs::path& p, std::span<const std::byte> b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<fs::path> block_files(const fs::path& dir) {
  std::vector<fs::path> v;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".kvb") v.push_back(e.path());
  return v;
}

}  // namespace

TEST(BlockFile, RoundTripAndEveryDamageRefused) {
  const KvLayout l = layout();
  const auto payload = random_bytes(l.block_bytes, 1);
  const auto t = toks(4, 0);
  const auto file = encode_block_file(77, 1234, t, l, payload);
  ASSERT_EQ(file.size(), block_file_size(l));
  BlockFileHeader h;
  std::string why;
  const size_t at = check_block_file(file, 77, l, h, why);
  ASSERT_TRUE(why.empty()) << why;
  EXPECT_EQ(h.chain_hash, 1234u);
  EXPECT_EQ(h.tokens, t);
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), file.begin() + at));

  check_block_file(file, 78, l, h, why);  // another store key: another model or tokenizer
  EXPECT_NE(why.find("another model"), std::string::npos) << why;
  check_block_file(file, 77, layout(4, DType::bf16), h, why);  // another dtype
  EXPECT_NE(why.find("layout"), std::string::npos) << why;
  check_block_file(file, 77, layout(8), h, why);  // another block size
  EXPECT_NE(why.find("layout"), std::string::npos) << why;
  auto v2 = file;
  v2[8] = std::byte{2};  // version field
  check_block_file(v2, 77, l, h, why);
  EXPECT_NE(why.find("version 2"), std::string::npos) << why;
  auto bad_magic = file;
  bad_magic[0] = std::byte{'X'};
  check_block_file(bad_magic, 77, l, h, why);
  EXPECT_NE(why.find("magic"), std::string::npos) << why;
  for (size_t cut : {size_t{0}, size_t{5}, block_header_size(l) - 1, block_header_size(l) + 3, file.size() - 1}) {
    check_block_file(std::span(file).first(cut), 77, l, h, why);
    EXPECT_FALSE(why.empty()) << "truncated to " << cut;
  }
  // Any one flipped byte (header, tokens, payload or checksum) is caught.
  for (size_t i = 0; i < file.size(); i += 7) {
    auto flip = file;
    flip[i] ^= std::byte{0x10};
    check_block_file(flip, 77, l, h, why);
    EXPECT_FALSE(why.empty()) << "byte " << i;
  }
}

TEST(SsdCache, ASecondInstanceReadsWhatTheFirstWrote) {
  TempDir d;
  const KvLayout l = layout();
  std::vector<std::vector<std::byte>> payloads;
  {
    SsdCache c({d.p.string(), 1 << 20}, 9, l, "test-model");
    for (int i = 0; i < 5; ++i) {
      payloads.push_back(random_bytes(l.block_bytes, 10 + i));
      c.write(100 + i, toks(4, i), payloads.back());
    }
    c.flush();
    EXPECT_EQ(c.stats().blocks, 5);
    EXPECT_EQ(c.stats().bytes_written, 5 * static_cast<int64_t>(block_file_size(l)));
  }
  SsdCache c({d.p.string(), 1 << 20}, 9, l, "test-model");
  EXPECT_EQ(c.stats().blocks, 5);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c.contains(100 + i));
    auto got = c.read(100 + i, toks(4, i));
    ASSERT_TRUE(got);
    EXPECT_EQ(*got, payloads[i]);
  }
  EXPECT_EQ(c.stats().hits, 5);
  // Other tokens under the same hash (a collision) are refused, and the file goes.
  EXPECT_FALSE(c.read(100, toks(4, 99)));
  EXPECT_EQ(c.stats().rejected, 1);
  EXPECT_FALSE(c.contains(100));
  // Another store key (model, tokenizer or layout) is another folder: nothing shared.
  SsdCache other({d.p.string(), 1 << 20}, 10, l, "other");
  EXPECT_EQ(other.stats().blocks, 0);
}

TEST(SsdCache, ARunIsReadInParallelAndEndsAtTheFirstDamagedBlock) {
  TempDir d;
  const KvLayout l = layout();
  constexpr int kBlocks = 20, kBad = 11;
  std::vector<std::vector<std::byte>> payloads;
  std::vector<uint64_t> hashes;
  std::vector<int32_t> tokens;
  std::string folder;
  {
    SsdCache c({d.p.string(), 1 << 20}, 9, l, "m");
    folder = c.folder();
    for (int i = 0; i < kBlocks; ++i) {
      payloads.push_back(random_bytes(l.block_bytes, 50 + i));
      hashes.push_back(500 + i);
      const std::vector<int32_t> t = toks(4, i);
      tokens.insert(tokens.end(), t.begin(), t.end());
      c.write(hashes.back(), t, payloads.back());
    }
    c.flush();
  }
  SsdCache c({d.p.string(), 1 << 20}, 9, l, "m");
  // Whole run: every block, in order, equal to what was written.
  std::vector<SsdCache::Loaded> run = c.read_run(hashes, tokens);
  ASSERT_EQ(run.size(), static_cast<size_t>(kBlocks));
  for (int i = 0; i < kBlocks; ++i) {
    const std::span<const std::byte> p = run[i].payload();
    EXPECT_TRUE(std::equal(p.begin(), p.end(), payloads[i].begin(), payloads[i].end())) << "block " << i;
  }
  EXPECT_EQ(c.stats().hits, kBlocks);
  // A flipped byte in one block: the run stops before it, its file goes, the later ones stay.
  const fs::path bad = fs::path(folder) / fmt::format("{:016x}.kvb", hashes[kBad]);
  std::vector<std::byte> b = slurp(bad);
  b[b.size() / 2] ^= std::byte{0x40};
  spit(bad, b);
  run = c.read_run(hashes, tokens);
  EXPECT_EQ(run.size(), static_cast<size_t>(kBad));
  EXPECT_EQ(c.stats().rejected, 1);
  EXPECT_FALSE(c.contains(hashes[kBad]));
  EXPECT_FALSE(fs::exists(bad));
  EXPECT_TRUE(c.contains(hashes[kBad + 1]));
  // Other tokens for the first block (a collision): nothing is read.
  std::vector<int32_t> other = tokens;
  other[0] += 1;
  EXPECT_TRUE(c.read_run(hashes, other).empty());
}

TEST(SsdCache, DamagedStrayAndTemporaryFilesAreDeletedNeverUsed) {
  TempDir d;
  const KvLayout l = layout();
  std::string folder;
  {
    SsdCache c({d.p.string(), 1 << 20}, 9, l, "m");
    folder = c.folder();
    for (int i = 0; i < 4; ++i) c.write(200 + i, toks(4, i), random_bytes(l.block_bytes, i));
    c.flush();
  }
  auto files = block_files(d.p);
  ASSERT_EQ(files.size(), 4u);
  std::sort(files.begin(), files.end());
  auto b0 = slurp(files[0]);
  b0.resize(b0.size() / 2);  // truncated: found at start-up
  spit(files[0], b0);
  auto b1 = slurp(files[1]);
  b1[b1.size() / 2] ^= std::byte{1};  // a flipped payload byte: found when read
  spit(files[1], b1);
  spit(fs::path(folder) / "00000000000000aa.kvb.tmp123", random_bytes(50, 3));  // a write cut by kill -9
  spit(fs::path(folder) / "00000000000000bb.kvb", random_bytes(block_file_size(l), 4));  // garbage of the right size

  SsdCache c({d.p.string(), 1 << 20}, 9, l, "m");
  EXPECT_EQ(c.stats().blocks, 3);    // the truncated and the garbage file are gone
  EXPECT_EQ(c.stats().rejected, 2);
  EXPECT_FALSE(fs::exists(files[0]));
  EXPECT_FALSE(fs::exists(fs::path(folder) / "00000000000000aa.kvb.tmp123"));
  EXPECT_FALSE(fs::exists(fs::path(folder) / "00000000000000bb.kvb"));
  // The flipped one is still indexed (only its header was read), but reading it fails and deletes it.
  int bad = -1;
  for (int i = 0; i < 4; ++i)
    if (files[1].filename().string().find(fmt::format("{:016x}", 200 + i)) == 0) bad = i;
  ASSERT_GE(bad, 0);
  EXPECT_FALSE(c.read(200 + bad, toks(4, bad)));
  EXPECT_EQ(c.stats().rejected, 3);
  EXPECT_FALSE(fs::exists(files[1]));
}

TEST(SsdCache, TheByteBudgetHoldsLeastRecentlyUsedFirst) {
  TempDir d;
  const KvLayout l = layout();
  const uint64_t budget = 3 * block_file_size(l);
  SsdCache c({d.p.string(), budget}, 9, l, "m");
  for (int i = 0; i < 3; ++i) c.write(300 + i, toks(4, i), random_bytes(l.block_bytes, i));
  c.flush();
  ASSERT_TRUE(c.read(300, toks(4, 0)));  // 300 is now the most recent
  for (int i = 3; i < 6; ++i) {
    c.write(300 + i, toks(4, i), random_bytes(l.block_bytes, i));
    c.flush();
  }
  EXPECT_LE(static_cast<uint64_t>(c.stats().bytes), budget);
  EXPECT_EQ(block_files(d.p).size(), 3u);
  EXPECT_EQ(c.stats().evictions, 3);
  EXPECT_TRUE(c.contains(305));
  EXPECT_FALSE(c.contains(301));
}

TEST(SsdCache, AFailedWriteTurnsWritingOffAndReadsGoOn) {
  TempDir d;
  const KvLayout l = layout();
  SsdCache c({d.p.string(), 1 << 20}, 9, l, "m");
  c.write(1, toks(4, 1), random_bytes(l.block_bytes, 1));
  c.flush();
  // The next block's temporary name is taken by a folder: its write fails as on a full or read-only disk.
  fs::create_directory(fs::path(c.folder()) / fmt::format("{:016x}.kvb.tmp{}", 2, ::getpid()));
  c.write(2, toks(4, 2), random_bytes(l.block_bytes, 2));
  c.flush();
  EXPECT_FALSE(c.stats().writable);
  c.write(3, toks(4, 3), random_bytes(l.block_bytes, 3));  // dropped, no error
  c.flush();
  EXPECT_EQ(c.stats().dropped, 2);
  EXPECT_EQ(c.stats().blocks, 1);
  EXPECT_TRUE(c.read(1, toks(4, 1)));  // what is on disk still serves
}

TEST(SsdCache, AFolderThatCannotBeMadeLeavesTheTierOff) {
  SsdCache c({"/proc/kiln-no-such-place", 1 << 20}, 9, layout(), "m");
  EXPECT_FALSE(c.stats().writable);
  EXPECT_FALSE(c.contains(1));
  c.write(1, toks(4, 1), random_bytes(layout().block_bytes, 1));
  c.flush();
  EXPECT_EQ(c.stats().dropped, 1);
}

namespace {

PromptCache sample_cache(int block_size = 4, int n_blocks = 3) {
  PromptCache pc;
  pc.model = "m";
  pc.model_fingerprint = 0x1111;
  pc.tokenizer_fingerprint = 0x2222;
  pc.tokens = toks(block_size * n_blocks + 2, 1);
  pc.layout = layout(block_size);
  pc.n_layers = 2;
  pc.n_blocks = n_blocks;
  pc.data = random_bytes(n_blocks * pc.layout.block_bytes, 5);
  return pc;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PromptCacheFile, RoundTripAndReblocking) {
  TempDir d;
  const std::string path = (d.p / "c.safetensors").string();
  const PromptCache pc = sample_cache();
  save_prompt_cache(path, pc);
  const PromptCache back = load_prompt_cache(path);
  EXPECT_EQ(back.tokens, pc.tokens);
  EXPECT_EQ(back.data, pc.data);
  EXPECT_EQ(back.n_blocks, 3);
  EXPECT_EQ(back.layout, pc.layout);
  EXPECT_NO_THROW(check_prompt_cache_layout(back, path, layout(4)));
  EXPECT_NO_THROW(check_prompt_cache_layout(back, path, layout(2)));  // another block size is fine
  // Re-blocked into blocks of 8: one full block, whose rows are tokens 0..7 of the file's.
  int n = 0;
  const auto re = reblock(back, layout(8), n);
  ASSERT_EQ(n, 1);
  const KvLayout l8 = layout(8);
  for (size_t p = 0; p < 4; ++p)
    for (int t = 0; t < 8; ++t) {
      const size_t row = 8 * sizeof(float);
      const std::byte* src = pc.data.data() + (t / 4) * pc.layout.block_bytes + p * pc.layout.planes[0].bytes + (t % 4) * row;
      const std::byte* dst = re.data() + p * l8.planes[0].bytes + t * row;
      EXPECT_EQ(std::memcmp(src, dst, row), 0) << "plane " << p << " token " << t;
    }
}

TEST(PromptCacheFile, EveryMismatchAndDamageIsRefusedSayingWhich) {
  TempDir d;
  const std::string path = (d.p / "c.safetensors").string();
  save_prompt_cache(path, sample_cache());
  const PromptCache pc = load_prompt_cache(path);
  EXPECT_NE(error_of([&] { check_prompt_cache_model(pc, path, 0x9999, 0x2222); }).find("another model"), std::string::npos);
  EXPECT_NE(error_of([&] { check_prompt_cache_model(pc, path, 0x1111, 0x9999); }).find("another tokenizer"), std::string::npos);
  EXPECT_NO_THROW(check_prompt_cache_model(pc, path, 0x1111, 0x2222));
  // Another KV layout: a quantized or bf16 cache (another dtype, another row width).
  EXPECT_NE(error_of([&] { check_prompt_cache_layout(pc, path, layout(4, DType::bf16)); }).find("layout"), std::string::npos);
  EXPECT_NE(error_of([&] { check_prompt_cache_layout(pc, path, layout(4, DType::u32, 2)); }).find("--kv-bits"), std::string::npos);

  const auto bytes = slurp(path);
  const std::string bad = (d.p / "bad.safetensors").string();
  spit(bad, std::span(bytes).first(bytes.size() - 10));  // truncated
  EXPECT_NE(error_of([&] { load_prompt_cache(bad); }).find("truncated"), std::string::npos);
  auto flipped = bytes;
  flipped[flipped.size() - 5] ^= std::byte{4};  // a K/V byte
  spit(bad, flipped);
  EXPECT_NE(error_of([&] { load_prompt_cache(bad); }).find("checksum"), std::string::npos);
  // Another format version (the metadata edited in place, same length).
  std::string s(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const size_t at = s.find("\"version\":\"1\"");
  ASSERT_NE(at, std::string::npos);
  s[at + 11] = '7';
  spit(bad, std::as_bytes(std::span(s)));
  EXPECT_NE(error_of([&] { load_prompt_cache(bad); }).find("version 7"), std::string::npos);
}

TEST(PromptCacheFile, RotatingCacheSettingRoundTripsAndMustMatch) {
  TempDir d;
  const std::string plain = (d.p / "plain.safetensors").string(), rot = (d.p / "rot.safetensors").string();
  save_prompt_cache(plain, sample_cache());
  PromptCache pc = sample_cache();
  pc.max_kv_size = 64;
  save_prompt_cache(rot, pc);
  const PromptCache a = load_prompt_cache(plain), b = load_prompt_cache(rot);
  EXPECT_EQ(a.max_kv_size, 0);
  EXPECT_EQ(b.max_kv_size, 64);
  EXPECT_NO_THROW(check_prompt_cache_rotation(a, plain, 0));
  EXPECT_NO_THROW(check_prompt_cache_rotation(b, rot, 64));
  EXPECT_NE(error_of([&] { check_prompt_cache_rotation(a, plain, 64); }).find("made with no --max-kv-size"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_prompt_cache_rotation(b, rot, 0); }).find("made with --max-kv-size 64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_prompt_cache_rotation(b, rot, 128); }).find("--max-kv-size 128"), std::string::npos);
  // The setting is under the checksum: edited in place, the file is refused.
  const auto bytes = slurp(rot);
  std::string s(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const size_t at = s.find("\"max_kv_size\":\"64\"");
  ASSERT_NE(at, std::string::npos);
  s[at + 15] = '9';
  const std::string bad = (d.p / "bad.safetensors").string();
  spit(bad, std::as_bytes(std::span(s)));
  EXPECT_NE(error_of([&] { load_prompt_cache(bad); }).find("checksum"), std::string::npos);
}
