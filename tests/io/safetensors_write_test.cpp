// Writer round trips: every dtype (incl. scalars, empty tensors and a misaligning u8 tensor),
// the raw layout (8-aligned padded header, given order, no gaps), sharded output with an index,
// rewriting a folder in the other layout, and the writer's own input checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "io_test_util.h"
#include "kiln/io/safetensors.h"

namespace kiln::io {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Named = std::vector<std::pair<std::string, Tensor>>;

Tensor random_tensor(DType t, Shape s, std::mt19937& rng) {
  Tensor x = Tensor::host(t, std::move(s));
  auto* p = static_cast<uint8_t*>(x.data);
  for (size_t i = 0; i < x.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return x;
}

Named every_dtype(std::mt19937& rng) {
  return {
      {"a.u8", random_tensor(DType::u8, {3}, rng)},  // 3 bytes: what follows is misaligned in the file
      {"b.f32", random_tensor(DType::f32, {2, 3}, rng)},
      {"c.bf16", random_tensor(DType::bf16, {5}, rng)},
      {"d.f16", random_tensor(DType::f16, {1, 3}, rng)},
      {"e.i32", random_tensor(DType::i32, {4}, rng)},
      {"f.u32", random_tensor(DType::u32, {2, 2}, rng)},
      {"g.scalar", random_tensor(DType::f32, {}, rng)},
      {"h.empty", random_tensor(DType::bf16, {0, 4}, rng)},
      {"i.u8", random_tensor(DType::u8, {7, 9}, rng)},
  };
}

void expect_same(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.shape, want.shape);
  ASSERT_EQ(got.nbytes(), want.nbytes());
  if (want.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(got.data, want.data, want.nbytes()), 0);
  }
  // Views of misaligned data are copies, so every element load is aligned.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data) % dtype_size(got.dtype), 0u);
}

TEST(SafetensorsWrite, RoundTripEveryDType) {
  std::mt19937 rng(7);
  test::TempDir tmp;
  Named tensors = every_dtype(rng);
  std::string path = tmp / "all.safetensors";
  write_safetensors_file(path, tensors, {{"format", "pt"}, {"note", "kiln \xe2\x9c\x93"}});

  SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.tensors().count(name));
    expect_same(f.tensors().at(name), t);
  }
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "kiln \xe2\x9c\x93"}}));
}

TEST(SafetensorsWrite, RawLayoutIsHuggingFaceCompatible) {
  std::mt19937 rng(8);
  test::TempDir tmp;
  Named tensors = every_dtype(rng);
  std::string path = tmp / "raw.safetensors";
  write_safetensors_file(path, tensors);
  std::string bytes = test::read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u);  // data starts 8-aligned; padding is spaces after the JSON
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
  auto h = nlohmann::ordered_json::parse(header);
  EXPECT_FALSE(h.contains("__metadata__"));  // none given, none written
  // Entries in the given order, data contiguous from 0, file ends with the last tensor.
  uint64_t offset = 0;
  size_t i = 0;
  for (auto it = h.begin(); it != h.end(); ++it, ++i) {
    ASSERT_LT(i, tensors.size());
    EXPECT_EQ(it.key(), tensors[i].first);
    EXPECT_EQ(it.value()["dtype"], safetensors_dtype_name(tensors[i].second.dtype));
    EXPECT_EQ(it.value()["data_offsets"][0].get<uint64_t>(), offset);
    offset += tensors[i].second.nbytes();
    EXPECT_EQ(it.value()["data_offsets"][1].get<uint64_t>(), offset);
  }
  EXPECT_EQ(i, tensors.size());
  EXPECT_EQ(bytes.size(), 8 + n + offset);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, tensors[0].second.data, 3), 0);
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(getpid())));
}

TEST(SafetensorsWrite, SmallModelIsOneFile) {
  std::mt19937 rng(9);
  test::TempDir tmp;
  Named tensors = every_dtype(rng);
  write_safetensors_dir(tmp.path(), tensors, {{"format", "pt"}});
  EXPECT_TRUE(fs::exists(tmp / "model.safetensors"));
  EXPECT_FALSE(fs::exists(tmp / "model.safetensors.index.json"));
  WeightSet w = WeightSet::open_dir(tmp.path());
  ASSERT_EQ(w.size(), tensors.size());
  for (const auto& [name, t] : tensors) expect_same(w.get(name), t);
}

// Shard files in index order with their tensors in data order.
std::vector<std::pair<std::string, std::vector<std::string>>> shard_contents(const std::string& dir, size_t n) {
  std::vector<std::pair<std::string, std::vector<std::string>>> r;
  for (size_t i = 1; i <= n; ++i) {
    std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i, n);
    std::string bytes = test::read_bytes(dir + "/" + name);
    uint64_t hn = 0;
    std::memcpy(&hn, bytes.data(), 8);
    auto h = nlohmann::ordered_json::parse(bytes.substr(8, hn));
    std::vector<std::string> names;
    for (auto it = h.begin(); it != h.end(); ++it)
      if (it.key() != "__metadata__") names.push_back(it.key());
    r.emplace_back(name, names);
  }
  return r;
}

TEST(SafetensorsWrite, ShardedWithIndex) {
  std::mt19937 rng(10);
  test::TempDir tmp;
  const uint64_t max_bytes = 1000;
  Named tensors;
  for (int i = 0; i < 9; ++i) {
    DType dts[] = {DType::f32, DType::bf16, DType::u8, DType::u32, DType::f16, DType::i32};
    DType d = dts[i % 6];
    tensors.emplace_back(fmt::format("layers.{}.w", i), random_tensor(d, {4, 3 + 5 * i}, rng));
  }
  tensors.emplace_back("huge", random_tensor(DType::f32, {300}, rng));  // 1200 bytes > max: alone
  tensors.emplace_back("tail", random_tensor(DType::u8, {5}, rng));
  std::map<std::string, uint64_t> bytes_of;
  uint64_t total = 0;
  for (const auto& [n, t] : tensors) total += bytes_of[n] = t.nbytes();
  ASSERT_GT(total, max_bytes);

  write_safetensors_dir(tmp.path(), tensors, {{"format", "pt"}}, max_bytes);
  EXPECT_FALSE(fs::exists(tmp / "model.safetensors"));
  auto index = nlohmann::json::parse(test::read_bytes(tmp / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  const auto& weight_map = index["weight_map"];
  ASSERT_EQ(weight_map.size(), tensors.size());

  size_t n_shards = 0;
  for (const auto& e : fs::directory_iterator(tmp.path()))
    if (e.path().extension() == ".safetensors") ++n_shards;
  ASSERT_GE(n_shards, 3u);
  auto shards = shard_contents(tmp.path(), n_shards);
  std::vector<std::string> order;
  for (size_t s = 0; s < shards.size(); ++s) {
    const auto& [file, names] = shards[s];
    SCOPED_TRACE(file);
    ASSERT_FALSE(names.empty());
    uint64_t sum = 0;
    for (const auto& n : names) {
      sum += bytes_of[n];
      EXPECT_EQ(weight_map[n], file);  // the index agrees with the shard
      order.push_back(n);
    }
    if (names.size() > 1) {
      EXPECT_LE(sum, max_bytes);
    }
    if (names.size() == 1 && names[0] == "huge") {
      EXPECT_GT(sum, max_bytes);
    }
    // Greedy: the next shard's first tensor would not have fit in this one.
    if (s + 1 < shards.size()) {
      EXPECT_GT(sum + bytes_of[shards[s + 1].second.front()], max_bytes);
    }
  }
  std::vector<std::string> given;
  for (const auto& [n, t] : tensors) given.push_back(n);
  EXPECT_EQ(order, given);  // the given order survives sharding

  WeightSet w = WeightSet::open_dir(tmp.path());
  ASSERT_EQ(w.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    expect_same(w.get(name), t);
  }
  SafetensorsFile first = SafetensorsFile::open(tmp / shards[0].first);
  EXPECT_EQ(first.metadata().at("format"), "pt");
}

TEST(SafetensorsWrite, RewriteRemovesTheOtherLayout) {
  std::mt19937 rng(11);
  test::TempDir tmp;
  Named big;
  for (int i = 0; i < 4; ++i) big.emplace_back(fmt::format("t{}", i), random_tensor(DType::f32, {100}, rng));
  write_safetensors_dir(tmp.path(), big, {}, 500);  // 4 shards of 400 bytes
  EXPECT_TRUE(fs::exists(tmp / "model-00004-of-00004.safetensors"));
  test::write_bytes(tmp / "notes.txt", "user file");

  Named small = {{"x", random_tensor(DType::bf16, {3}, rng)}};
  write_safetensors_dir(tmp.path(), small);
  EXPECT_TRUE(fs::exists(tmp / "model.safetensors"));
  EXPECT_FALSE(fs::exists(tmp / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(tmp / "model-00001-of-00004.safetensors"));
  EXPECT_TRUE(fs::exists(tmp / "notes.txt"));
  WeightSet w = WeightSet::open_dir(tmp.path());
  EXPECT_EQ(w.names(), std::vector<std::string>{"x"});

  write_safetensors_dir(tmp.path(), big, {}, 900);  // 2 shards of 800 bytes
  EXPECT_FALSE(fs::exists(tmp / "model.safetensors"));
  EXPECT_TRUE(fs::exists(tmp / "model-00002-of-00002.safetensors"));
  EXPECT_EQ(WeightSet::open_dir(tmp.path()).size(), 4u);
}

TEST(SafetensorsWrite, RejectsBadInputNamingThePath) {
  std::mt19937 rng(12);
  test::TempDir tmp;
  std::string path = tmp / "bad.safetensors";
  Tensor t = random_tensor(DType::f32, {2}, rng);
  std::string err = test::error_of([&] { write_safetensors_file(path, {{"w", t}, {"w", t}}); });
  EXPECT_THAT(err, HasSubstr("[safetensors] " + path + ": tensor \"w\" is listed twice"));
  err = test::error_of([&] { write_safetensors_file(path, {{"__metadata__", t}}); });
  EXPECT_THAT(err, HasSubstr(path));
  Tensor dev = t;
  dev.device = Device::cuda;
  err = test::error_of([&] { write_safetensors_file(path, {{"w", dev}}); });
  EXPECT_THAT(err, HasSubstr("not in host memory"));
  EXPECT_FALSE(fs::exists(path));

  std::string nowhere = tmp / "no/such/dir/x.safetensors";
  err = test::error_of([&] { write_safetensors_file(nowhere, {{"w", t}}); });
  EXPECT_THAT(err, HasSubstr("[safetensors] cannot write " + nowhere));
}

}  // namespace
}  // namespace kiln::io
