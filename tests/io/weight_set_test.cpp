// WeightSet over model folders: sharded folders whose index and shards disagree, loose
// *.safetensors files (duplicates across files), empty and missing folders. Every error is a
// one-line kiln::Error naming the folder or the file at fault.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io_test_util.h"
#include "kiln/io/safetensors.h"

namespace kiln::io {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

Tensor filled(DType d, Shape s, uint8_t v) {
  Tensor t = Tensor::host(d, std::move(s));
  std::memset(t.data, v, t.nbytes());
  return t;
}

// Four 400-byte tensors: with max_shard_bytes 800, two shards of two tensors.
std::vector<std::pair<std::string, Tensor>> four_tensors() {
  std::vector<std::pair<std::string, Tensor>> r;
  for (int i = 0; i < 4; ++i) r.emplace_back(fmt::format("t{}", i), filled(DType::f32, {100}, static_cast<uint8_t>(i + 1)));
  return r;
}

std::string open_error(const std::string& dir) {
  std::string err = test::error_of([&] { WeightSet::open_dir(dir); });
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  return err;
}

TEST(WeightSet, ShardedFolderReadsBack) {
  test::TempDir tmp;
  write_safetensors_dir(tmp.path(), four_tensors(), {}, 800);
  ASSERT_TRUE(fs::exists(tmp / "model-00002-of-00002.safetensors"));
  WeightSet w = WeightSet::open_dir(tmp.path());
  EXPECT_EQ(w.names(), (std::vector<std::string>{"t0", "t1", "t2", "t3"}));
  EXPECT_EQ(w.get("t3").ptr<uint8_t>()[399], 4);
  EXPECT_EQ(w.source("t3"), tmp.path() + "/model-00002-of-00002.safetensors");
}

TEST(WeightSet, IndexNamingAMissingShard) {
  test::TempDir tmp;
  write_safetensors_dir(tmp.path(), four_tensors(), {}, 800);
  fs::remove(tmp / "model-00002-of-00002.safetensors");
  std::string err = open_error(tmp.path());
  EXPECT_THAT(err, StartsWith("[weights] " + tmp.path() + "/model.safetensors.index.json: names shard "
                              "\"model-00002-of-00002.safetensors\" which does not exist"));
}

TEST(WeightSet, IndexNamingATensorTheShardLacks) {
  test::TempDir tmp;
  write_safetensors_dir(tmp.path(), four_tensors(), {}, 800);
  std::string index_path = tmp / "model.safetensors.index.json";
  auto index = nlohmann::json::parse(test::read_bytes(index_path));
  index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors";
  test::write_bytes(index_path, index.dump());
  EXPECT_THAT(open_error(tmp.path()),
              StartsWith("[weights] " + index_path + ": maps tensor \"ghost\" to model-00001-of-00002.safetensors "
                         "but that shard does not contain it"));
}

TEST(WeightSet, MalformedIndex) {
  test::TempDir tmp;
  write_safetensors_dir(tmp.path(), four_tensors(), {}, 800);
  std::string index_path = tmp / "model.safetensors.index.json";
  test::write_bytes(index_path, "{\"weight_map\": {");
  EXPECT_THAT(open_error(tmp.path()), StartsWith("[weights] " + index_path + ": invalid JSON"));
  test::write_bytes(index_path, R"({"metadata": {}})");
  EXPECT_THAT(open_error(tmp.path()), HasSubstr(index_path + ": no \"weight_map\" object"));
  test::write_bytes(index_path, R"({"weight_map": {"t0": 3}})");
  EXPECT_THAT(open_error(tmp.path()), HasSubstr("weight_map entry for \"t0\" is a JSON number"));
  test::write_bytes(index_path, R"({"weight_map": {"t0": "../model-00001-of-00002.safetensors"}})");
  EXPECT_THAT(open_error(tmp.path()), HasSubstr("shard \"../model-00001-of-00002.safetensors\" is not a file name inside"));
  test::write_bytes(index_path, R"({"weight_map": {"t0": "/etc/passwd"}})");
  EXPECT_THAT(open_error(tmp.path()), HasSubstr("is not a file name inside the model folder"));
}

TEST(WeightSet, CorruptShardNamesTheShard) {
  test::TempDir tmp;
  write_safetensors_dir(tmp.path(), four_tensors(), {}, 800);
  std::string shard = tmp / "model-00001-of-00002.safetensors";
  std::string bytes = test::read_bytes(shard);
  test::write_bytes(shard, bytes.substr(0, bytes.size() - 10));
  EXPECT_THAT(open_error(tmp.path()), StartsWith("[safetensors] " + shard + ": "));
}

TEST(WeightSet, LooseFilesAndDuplicates) {
  test::TempDir tmp;
  write_safetensors_file(tmp / "weights.00.safetensors", {{"a", filled(DType::u8, {3}, 1)}});
  write_safetensors_file(tmp / "weights.01.safetensors", {{"b", filled(DType::bf16, {2}, 2)}});
  test::write_bytes(tmp / "README.md", "not weights");
  WeightSet w = WeightSet::open_dir(tmp.path());
  EXPECT_EQ(w.names(), (std::vector<std::string>{"a", "b"}));

  write_safetensors_file(tmp / "weights.02.safetensors", {{"a", filled(DType::u8, {3}, 9)}});
  EXPECT_EQ(open_error(tmp.path()), "[weights] " + tmp.path() + ": tensor \"a\" appears in both " + tmp.path() +
                                        "/weights.00.safetensors and " + tmp.path() + "/weights.02.safetensors");

  // model.safetensors wins over loose files when present.
  write_safetensors_file(tmp / "model.safetensors", {{"m", filled(DType::i32, {1}, 3)}});
  EXPECT_EQ(WeightSet::open_dir(tmp.path()).names(), std::vector<std::string>{"m"});
}

TEST(WeightSet, EmptyAndMissingFolders) {
  test::TempDir tmp;
  EXPECT_EQ(open_error(tmp.path()), "[weights] " + tmp.path() +
                                        ": no model.safetensors, model.safetensors.index.json or other *.safetensors "
                                        "file in this folder");
  EXPECT_EQ(open_error(tmp / "nope"), "[weights] " + tmp.path() + "/nope: no such folder");
  test::write_bytes(tmp / "file", "x");
  EXPECT_EQ(open_error(tmp / "file"), "[weights] " + tmp.path() + "/file: not a folder");
}

}  // namespace
}  // namespace kiln::io
