// Bad safetensors input: every malformation the reader validates gives a one-line kiln::Error
// "[safetensors] PATH: problem", never a crash or an out-of-bounds view. Ends with a sweep of
// randomly corrupted real headers (each must load or fail cleanly).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "io_test_util.h"
#include "kiln/io/safetensors.h"

namespace kiln::io {
namespace {
using ::testing::HasSubstr;
using ::testing::StartsWith;

class BadSafetensors : public ::testing::Test {
 protected:
  // Writes `bytes` to a file and returns the error opening it gives.
  std::string error_for(const std::string& bytes, const std::string& name = "bad.safetensors") {
    path_ = tmp_ / name;
    test::write_bytes(path_, bytes);
    return test::error_of([&] { SafetensorsFile::open(path_); });
  }
  // The error names the file first, says `what`, and is one line.
  void expect_error(const std::string& err, const std::string& what) {
    EXPECT_THAT(err, StartsWith("[safetensors] " + path_ + ": "));
    EXPECT_THAT(err, HasSubstr(what));
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  void expect_header_error(const std::string& header, const std::string& data, const std::string& what) {
    SCOPED_TRACE(header);
    expect_error(error_for(test::raw_safetensors(header, data)), what);
  }

  test::TempDir tmp_;
  std::string path_;
};

const std::string kData16(16, '\x01');

TEST_F(BadSafetensors, TooShortForTheLengthPrefix) {
  expect_error(error_for(""), "file is 0 bytes, too short");
  expect_error(error_for("abcd"), "file is 4 bytes, too short");
}

TEST_F(BadSafetensors, HeaderLengthPastTheEnd) {
  std::string bytes = test::raw_safetensors("{}", std::string(790, ' '), 12345);
  ASSERT_EQ(bytes.size(), 800u);
  std::string err = error_for(bytes, "model.safetensors");
  EXPECT_EQ(err, "[safetensors] " + path_ + ": header length 12345 runs past the end of the file (800 bytes); "
                 "the file is truncated or not safetensors");
  // A length of 2^64-1 must not wrap around in the bounds check.
  expect_error(error_for(test::raw_safetensors("{}", "", UINT64_MAX)), "runs past the end of the file");
}

TEST_F(BadSafetensors, TruncatedRealFile) {
  std::string real = test::read_bytes(test::kShared + "/models/stories260K/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, real.data(), 8);
  expect_error(error_for(real.substr(0, 5)), "too short");
  expect_error(error_for(real.substr(0, 8 + n / 2)), "header length 4848 runs past the end of the file");
  // Cut inside the data: the header parses, the last tensors' offsets run past the end.
  expect_error(error_for(real.substr(0, real.size() - 1000)), "past the end of the data");
  // Cut exactly after the header: no data at all.
  expect_error(error_for(real.substr(0, 8 + n)), "past the end of the data (0 bytes)");
}

TEST_F(BadSafetensors, HeaderOverTheSizeLimit) {
  // A sparse 200 MB file whose header claims 150 MB: within the file, over the 100 MB limit.
  path_ = tmp_ / "huge.safetensors";
  int fd = ::open(path_.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  std::string prefix = test::raw_safetensors("", "", 150'000'000);
  ASSERT_EQ(::write(fd, prefix.data(), 8), 8);
  ASSERT_EQ(::ftruncate(fd, 200'000'000), 0);
  ::close(fd);
  expect_error(test::error_of([&] { SafetensorsFile::open(path_); }), "header length 150000000 exceeds the 100000000 byte limit");
}

TEST_F(BadSafetensors, MalformedJson) {
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [4], )", kData16, "header is not valid JSON: parse error");
  expect_header_error("{} trailing", "", "header is not valid JSON");
  expect_header_error(std::string("{\"a\0\": 1}", 9), "", "header is not valid JSON");
  expect_header_error("{\"\xff\xfe\": {}}", "", "header is not valid UTF-8");
  expect_header_error("[1, 2]", "", "header is a JSON array, expected an object");
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                      kData16, "header JSON has the key \"a\" twice");
  std::string deep = "{\"__metadata__\": " + std::string(40, '[') + std::string(40, ']') + "}";
  expect_header_error(deep, "", "nested deeper than");
  expect_error(error_for(test::raw_safetensors("", kData16, 1)), "too small for a JSON object");
}

TEST_F(BadSafetensors, BadMetadata) {
  expect_header_error(R"({"__metadata__": {"format": 1}})", "", "\"__metadata__\" value for \"format\" is a JSON number");
  expect_header_error(R"({"__metadata__": ["pt"]})", "", "\"__metadata__\" is a JSON array");
}

TEST_F(BadSafetensors, BadDType) {
  expect_header_error(R"({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})", kData16,
                      "tensor \"w\" has unsupported dtype \"F64\" (kiln reads F32, F16, BF16, U32, I32, U8)");
  expect_header_error(R"({"w": {"dtype": "float32", "shape": [4], "data_offsets": [0, 16]}})", kData16, "unsupported dtype");
  expect_header_error(R"({"w": {"dtype": 7, "shape": [4], "data_offsets": [0, 16]}})", kData16, "has no \"dtype\" string");
  expect_header_error(R"({"w": {"shape": [4], "data_offsets": [0, 16]}})", kData16, "has no \"dtype\" string");
}

TEST_F(BadSafetensors, BadShape) {
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 16]}})", kData16,
                      "shape entry -1 that is not a non-negative integer");
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [2.0, 2], "data_offsets": [0, 16]}})", kData16, "not a non-negative integer");
  expect_header_error(R"({"w": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}})", kData16, "has no \"shape\" array");
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 16]}})", kData16,
                      "whose size overflows");
  // numel fits, numel * 4 bytes does not.
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 16]}})", kData16,
                      "whose size overflows");
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 16]}})", kData16,
                      "not a non-negative integer");
}

TEST_F(BadSafetensors, ShapeAndLengthDisagree) {
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", kData16,
                      "tensor \"w\" of shape [2, 2] and dtype F32 needs 16 bytes but data_offsets [0, 12] hold 12");
  expect_header_error(R"({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})", kData16, "needs 8 bytes");
}

TEST_F(BadSafetensors, OffsetsOutOfBounds) {
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", kData16,
                      "tensor \"w\" has data_offsets [0, 32] past the end of the data (16 bytes)");
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [17, 17]}})", kData16, "past the end of the data");
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [8, 4]}})", kData16, "end before they begin");
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [-4, 0]}})", kData16, "not non-negative integers");
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0]}})", kData16, "no \"data_offsets\" [begin, end] pair");
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4, 8]}})", kData16, "no \"data_offsets\"");
  expect_header_error(R"({"w": [1, 2]})", kData16, "tensor \"w\" is a JSON array, expected an object");
}

TEST_F(BadSafetensors, OverlappingRanges) {
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                      kData16, "tensors \"a\" [0, 8] and \"b\" [4, 12] overlap");
  expect_header_error(R"({"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
                          "b": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]}})",
                      kData16, "overlap");
}

TEST_F(BadSafetensors, EdgeCasesThatAreFine) {
  // Empty tensors may sit anywhere (even at the end), scalars have shape [], gaps are allowed.
  path_ = tmp_ / "ok.safetensors";
  test::write_bytes(path_, test::raw_safetensors(
                               R"({"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [16, 16]},
                                   "s": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]},
                                   "a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]},
                                   "z": {"dtype": "U8", "shape": [0], "data_offsets": [6, 6]},
                                   "g": {"dtype": "U8", "shape": [2], "data_offsets": [12, 14]}})",
                               kData16));
  SafetensorsFile f = SafetensorsFile::open(path_);
  EXPECT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.tensors().at("s").ptr<int32_t>()[0], 0x01010101);
  EXPECT_EQ(f.tensors().at("e").numel(), 0);
  EXPECT_TRUE(f.metadata().empty());
}

TEST_F(BadSafetensors, MissingFile) {
  std::string missing = tmp_ / "nope.safetensors";
  std::string err = test::error_of([&] { SafetensorsFile::open(missing); });
  EXPECT_THAT(err, StartsWith("[safetensors] cannot open " + missing + ": No such file"));
  err = test::error_of([&] { SafetensorsFile::open(tmp_.path()); });
  EXPECT_THAT(err, HasSubstr(tmp_.path() + " is not a regular file"));
}

// Random byte corruption of a real header, and random truncation: each case loads or throws
// kiln::Error (a crash or any other exception fails the test; ASan/UBSan builds see more).
TEST_F(BadSafetensors, CorruptionSweep) {
  std::string real = test::read_bytes(test::kShared + "/models/tiny-qwen3/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, real.data(), 8);
  std::mt19937 rng(1234);
  int failed = 0, loaded = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string bytes = real;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      size_t at = rng() % (8 + n);
      const char interesting[] = "0123456789[]{}\",:-eE \xff";
      bytes[at] = rng() % 2 ? static_cast<char>(rng()) : interesting[rng() % (sizeof(interesting) - 1)];
    }
    if (iter % 10 == 0) bytes.resize(rng() % bytes.size());
    auto m = MappedFile::from_static(bytes.data(), bytes.size(), "corrupt.safetensors");
    try {
      SafetensorsFile f = SafetensorsFile::from_mapping(m);
      for (const auto& [name, t] : f.tensors()) {  // every view lies inside the bytes
        auto p = static_cast<const char*>(t.data);
        bool inside = p >= bytes.data() && p + t.nbytes() <= bytes.data() + bytes.size();
        bool copied = t.holder && t.holder.get() == t.data && !inside;
        ASSERT_TRUE(inside || copied) << name;
      }
      ++loaded;
    } catch (const kiln::Error& e) {
      ASSERT_THAT(e.what(), StartsWith("[safetensors] corrupt.safetensors: "));
      ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      ++failed;
    }
  }
  EXPECT_GT(failed, 100);  // most corruptions are caught
  EXPECT_GT(loaded, 0);    // edits inside tensor names keep a valid file
}

}  // namespace
}  // namespace kiln::io
