// Reads the real model files in shared/models and checks them against an independent parse
// (plain ifstream + nlohmann) and against values Python's struct/json printed for them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io_test_util.h"
#include "kiln/io/safetensors.h"

namespace kiln::io {
namespace {
using test::kShared;

struct Expected {
  const char* model;
  size_t n_tensors;
  const char* dtype;  // every tensor of these files has one dtype
};
// Counted with python3 (json.loads of each header).
const Expected kModels[] = {
    {"stories260K", 47, "F32"},      {"tiny-gemma2", 35, "F32"},   {"tiny-gemma3_text", 54, "BF16"},
    {"tiny-llama", 30, "F32"},       {"tiny-llama3_rope_scaled", 30, "BF16"}, {"tiny-mistral", 30, "F32"},
    {"tiny-mixtral", 60, "F32"},     {"tiny-phi3", 21, "F32"},     {"tiny-qwen2", 38, "F32"},
    {"tiny-qwen3", 35, "BF16"},      {"tiny-qwen3_moe", 102, "BF16"},
};

TEST(SafetensorsRead, RealModelsMatchIndependentParse) {
  for (const auto& m : kModels) {
    SCOPED_TRACE(m.model);
    std::string path = kShared + "/models/" + m.model + "/model.safetensors";
    SafetensorsFile f = SafetensorsFile::open(path);
    EXPECT_EQ(f.path(), path);
    ASSERT_EQ(f.tensors().size(), m.n_tensors);
    EXPECT_EQ(f.metadata().at("format"), "pt");

    // Independent reading: the raw bytes and the header as nlohmann sees it.
    std::string bytes = test::read_bytes(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    auto header = nlohmann::json::parse(bytes.substr(8, n));
    const char* data = bytes.data() + 8 + n;
    for (const auto& [name, t] : f.tensors()) {
      SCOPED_TRACE(name);
      const auto& h = header.at(name);
      EXPECT_EQ(safetensors_dtype_name(t.dtype), h.at("dtype").get<std::string>());
      EXPECT_EQ(std::string(safetensors_dtype_name(t.dtype)), m.dtype);
      EXPECT_EQ(t.shape, h.at("shape").get<Shape>());
      uint64_t b = h.at("data_offsets")[0], e = h.at("data_offsets")[1];
      ASSERT_EQ(t.nbytes(), e - b);
      EXPECT_EQ(std::memcmp(t.data, data + b, e - b), 0);
      EXPECT_EQ(t.device, Device::cpu);
    }
  }
}

TEST(SafetensorsRead, TensorsAreViewsIntoOneMapping) {
  SafetensorsFile f = SafetensorsFile::open(kShared + "/models/stories260K/model.safetensors");
  // Offsets from python: embed [0, 131072), norm [131072, 131328), layers.4 down [952064, 996096).
  const Tensor& embed = f.tensors().at("model.embed_tokens.weight");
  const Tensor& norm = f.tensors().at("model.norm.weight");
  const Tensor& down = f.tensors().at("model.layers.4.mlp.down_proj.weight");
  auto at = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data); };
  EXPECT_EQ(at(norm) - at(embed), 131072u);
  EXPECT_EQ(at(down) - at(embed), 952064u);
  EXPECT_EQ(at(embed) % 8, 0u);  // data start is 8-aligned in a page-aligned mapping
}

TEST(SafetensorsRead, ValuesMatchPython) {
  Tensor embed, norm, down;
  {
    SafetensorsFile f = SafetensorsFile::open(kShared + "/models/stories260K/model.safetensors");
    embed = f.tensors().at("model.embed_tokens.weight");
    norm = f.tensors().at("model.norm.weight");
    down = f.tensors().at("model.layers.4.mlp.down_proj.weight");
  }  // the file object is gone; the tensors' holders keep the mapping alive
  EXPECT_EQ(embed.shape, (Shape{512, 64}));
  EXPECT_EQ(embed.dtype, DType::f32);
  EXPECT_FLOAT_EQ(embed.ptr<float>()[0], -0.29474878311157227f);
  EXPECT_FLOAT_EQ(embed.ptr<float>()[1], 0.5618956089019775f);
  EXPECT_FLOAT_EQ(embed.ptr<float>()[2], 0.1754225343465805f);
  EXPECT_FLOAT_EQ(embed.ptr<float>()[512 * 64 - 1], -0.424032598733902f);
  EXPECT_EQ(norm.shape, (Shape{64}));
  EXPECT_FLOAT_EQ(norm.ptr<float>()[0], 2.4583089351654053f);
  EXPECT_FLOAT_EQ(norm.ptr<float>()[63], 1.7077769041061401f);
  EXPECT_EQ(down.shape, (Shape{64, 172}));
  EXPECT_FLOAT_EQ(down.ptr<float>()[1], -0.02296368032693863f);
  EXPECT_FLOAT_EQ(down.ptr<float>()[64 * 172 - 1], -0.0035068716388195753f);

  SafetensorsFile q = SafetensorsFile::open(kShared + "/models/tiny-qwen3/model.safetensors");
  const Tensor& qe = q.tensors().at("model.embed_tokens.weight");
  EXPECT_EQ(qe.dtype, DType::bf16);
  EXPECT_EQ(qe.shape, (Shape{512, 64}));
  EXPECT_EQ(qe.ptr<uint16_t>()[0], 0xbda1);
  EXPECT_FLOAT_EQ(bf16_to_f32(qe.ptr<uint16_t>()[1]), -0.1376953125f);
  const Tensor& ln = q.tensors().at("model.layers.0.input_layernorm.weight");
  EXPECT_FLOAT_EQ(bf16_to_f32(ln.ptr<uint16_t>()[0]), 0.9453125f);
  EXPECT_FLOAT_EQ(bf16_to_f32(ln.ptr<uint16_t>()[2]), 0.88671875f);
}

TEST(SafetensorsRead, WeightSetOfRealFolder) {
  std::string dir = kShared + "/models/tiny-qwen3_moe";
  WeightSet w = WeightSet::open_dir(dir);
  EXPECT_EQ(w.size(), 102u);
  std::vector<std::string> names = w.names();
  EXPECT_EQ(names.size(), 102u);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_TRUE(w.has("model.embed_tokens.weight"));
  ASSERT_NE(w.find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(w.find("model.embed_tokens.weight"), &w.get("model.embed_tokens.weight"));
  EXPECT_EQ(w.find("nope"), nullptr);
  EXPECT_EQ(w.source("model.embed_tokens.weight"), dir + "/model.safetensors");
  EXPECT_EQ(test::error_of([&] { w.get("lm_head.missing"); }),
            "[weights] " + dir + ": missing tensor lm_head.missing");
}

TEST(SafetensorsRead, FromMappingOfBytesInMemory) {
  // The embedded model path: bytes that live for the program, named for error messages.
  static const std::string bytes = test::read_bytes(kShared + "/models/stories260K/model.safetensors");
  auto m = MappedFile::from_static(bytes.data(), bytes.size(), "<embedded>/model.safetensors");
  WeightSet w;
  w.add(SafetensorsFile::from_mapping(m));
  EXPECT_EQ(w.size(), 47u);
  EXPECT_EQ(w.dir(), "<embedded>/model.safetensors");
  EXPECT_FLOAT_EQ(w.get("model.norm.weight").ptr<float>()[0], 2.4583089351654053f);
  // Adding the same names again is an error naming both sources, and leaves the set unchanged.
  std::string err = test::error_of([&] { w.add(SafetensorsFile::from_mapping(m)); });
  EXPECT_THAT(err, ::testing::HasSubstr("appears in both <embedded>/model.safetensors and <embedded>/model.safetensors"));
  EXPECT_EQ(w.size(), 47u);
}

}  // namespace
}  // namespace kiln::io
