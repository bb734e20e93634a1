// The safetensors reader: maps a file and validates everything before handing out views —
// header length, UTF-8 JSON object, dtypes, shapes (no overflow), offsets inside the data,
// shape x dtype = byte length, and no two tensors sharing bytes. Nothing a malformed file
// contains can make a Tensor point outside the mapping.
#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <vector>

#include "kiln/base/error.h"
#include "kiln/base/json.h"
#include "kiln/base/utf8.h"
#include "kiln/io/safetensors.h"

namespace kiln::io {
namespace {

// Hugging Face's own reader refuses headers over 100 MB; a real header is a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// JSON nesting deeper than this is not a safetensors header (real ones are 3 levels deep).
constexpr int kMaxJsonDepth = 16;

struct DTypeEntry {
  const char* name;
  DType dtype;
};
constexpr DTypeEntry kDTypes[] = {{"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},
                                  {"U32", DType::u32}, {"I32", DType::i32}, {"U8", DType::u8}};

std::optional<DType> parse_dtype(const std::string& s) {
  for (const auto& d : kDTypes)
    if (s == d.name) return d.dtype;
  return std::nullopt;
}

// Keeps error lines short: names, parser messages and dtype strings come from the file.
std::string clip(const std::string& s, size_t n = 120) {
  if (s.size() <= n) return s;
  size_t cut = n;
  while (cut > 0 && (static_cast<uint8_t>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 char
  return s.substr(0, cut) + "...";
}

// Parses the header text; rejects duplicate keys in any object (a second entry for a name would
// silently hide the first) and absurd nesting.
Json parse_header_json(const std::string& where, const char* text, size_t n) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  auto cb = [&](int depth, Json::parse_event_t event, Json& parsed) -> bool {
    if (depth > kMaxJsonDepth) fail("safetensors", "{}: header JSON is nested deeper than {} levels", where, kMaxJsonDepth);
    switch (event) {
      case Json::parse_event_t::object_start: keys.emplace_back(); break;
      case Json::parse_event_t::object_end: if (!keys.empty()) keys.pop_back(); break;
      case Json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
          fail("safetensors", "{}: header JSON has the key \"{}\" twice", where, clip(parsed.get<std::string>()));
        break;
      default: break;
    }
    return true;
  };
  try {
    return Json::parse(text, text + n, cb);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    auto p = what.find("parse error");
    fail("safetensors", "{}: header is not valid JSON: {}", where, clip(p == std::string::npos ? what : what.substr(p), 200));
  }
}

// A JSON value that is a non-negative integer fitting in int64.
std::optional<uint64_t> as_index(const Json& v) {
  if (!v.is_number_unsigned()) return std::nullopt;
  uint64_t x = v.get<uint64_t>();
  if (x > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return x;
}

struct Range {
  uint64_t begin, end;
  const std::string* name;
};

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<MappedFile> file;
  try {
    file = MappedFile::open(path);
  } catch (const Error& e) {  // re-label "[io] cannot open PATH: ..." for this component
    fail("safetensors", "{}", std::string(e.what()).substr(e.component().size() + 3));
  }
  return from_mapping(std::move(file));
}

SafetensorsFile SafetensorsFile::from_mapping(std::shared_ptr<MappedFile> file) {
  KILN_ASSERT(file != nullptr);
  const std::string& where = file->path();
  const uint8_t* base = file->data();
  const uint64_t file_size = file->size();

  // 1. The length prefix.
  if (file_size < 8)
    fail("safetensors", "{}: file is {} bytes, too short for a safetensors file (it starts with an 8-byte header length); "
         "the file is truncated or not safetensors", where, file_size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian
  if (header_len > file_size - 8)
    fail("safetensors", "{}: header length {} runs past the end of the file ({} bytes); the file is truncated or not safetensors",
         where, header_len, file_size);
  if (header_len > kMaxHeaderBytes)
    fail("safetensors", "{}: header length {} exceeds the {} byte limit; not a safetensors file", where, header_len, kMaxHeaderBytes);
  if (header_len < 2) fail("safetensors", "{}: header length {} is too small for a JSON object", where, header_len);

  // 2. The header: UTF-8 JSON object.
  const char* header = reinterpret_cast<const char*>(base + 8);
  if (!utf8::valid(std::string_view(header, header_len)))
    fail("safetensors", "{}: header is not valid UTF-8; the file is corrupt or not safetensors", where);
  Json j = parse_header_json(where, header, header_len);
  if (!j.is_object()) fail("safetensors", "{}: header is a JSON {}, expected an object", where, j.type_name());

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;
  const uint8_t* data = base + data_start;

  SafetensorsFile f;
  f.path_ = where;
  f.file_ = file;
  std::vector<Range> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("safetensors", "{}: \"__metadata__\" is a JSON {}, expected an object of strings", where, v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail("safetensors", "{}: \"__metadata__\" value for \"{}\" is a JSON {}, expected a string", where, clip(m.key()), m.value().type_name());
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string shown = clip(name);
    if (!v.is_object()) fail("safetensors", "{}: tensor \"{}\" is a JSON {}, expected an object", where, shown, v.type_name());

    // dtype
    auto d = v.find("dtype");
    if (d == v.end() || !d->is_string()) fail("safetensors", "{}: tensor \"{}\" has no \"dtype\" string", where, shown);
    auto dtype = parse_dtype(d->get<std::string>());
    if (!dtype)
      fail("safetensors", "{}: tensor \"{}\" has unsupported dtype \"{}\" (kiln reads F32, F16, BF16, U32, I32, U8)",
           where, shown, clip(d->get<std::string>(), 40));

    // shape: non-negative integers whose product (times the dtype size) does not overflow.
    auto s = v.find("shape");
    if (s == v.end() || !s->is_array()) fail("safetensors", "{}: tensor \"{}\" has no \"shape\" array", where, shown);
    Shape shape;
    uint64_t numel = 1;
    bool overflow = false;
    for (const Json& dim : *s) {
      auto x = as_index(dim);
      if (!x) fail("safetensors", "{}: tensor \"{}\" has a shape entry {} that is not a non-negative integer", where, shown, clip(dim.dump(), 40));
      shape.push_back(static_cast<int64_t>(*x));
      overflow = overflow || __builtin_mul_overflow(numel, *x, &numel);
    }
    uint64_t nbytes = 0;
    overflow = overflow || numel > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dtype_size(*dtype), &nbytes);
    if (overflow) fail("safetensors", "{}: tensor \"{}\" has shape {} whose size overflows", where, shown, shape_str(shape));

    // data_offsets: [begin, end] inside the data, exactly nbytes long.
    auto o = v.find("data_offsets");
    if (o == v.end() || !o->is_array() || o->size() != 2)
      fail("safetensors", "{}: tensor \"{}\" has no \"data_offsets\" [begin, end] pair", where, shown);
    auto b = as_index((*o)[0]), e = as_index((*o)[1]);
    if (!b || !e) fail("safetensors", "{}: tensor \"{}\" has data_offsets {} that are not non-negative integers", where, shown, clip(o->dump(), 60));
    if (*b > *e) fail("safetensors", "{}: tensor \"{}\" has data_offsets [{}, {}] that end before they begin", where, shown, *b, *e);
    if (*e > data_size)
      fail("safetensors", "{}: tensor \"{}\" has data_offsets [{}, {}] past the end of the data ({} bytes); the file is truncated or corrupt",
           where, shown, *b, *e, data_size);
    if (*e - *b != nbytes)
      fail("safetensors", "{}: tensor \"{}\" of shape {} and dtype {} needs {} bytes but data_offsets [{}, {}] hold {}",
           where, shown, shape_str(shape), d->get<std::string>(), nbytes, *b, *e, *e - *b);
    if (nbytes > 0) ranges.push_back({*b, *e, &name});

    Tensor t;
    t.dtype = *dtype;
    t.shape = std::move(shape);
    t.device = Device::cpu;
    const uint8_t* p = data + *b;
    if (reinterpret_cast<uintptr_t>(p) % dtype_size(*dtype) == 0) {
      // Zero-copy: the view shares ownership of the mapping. Read-only memory (PROT_READ).
      t.data = const_cast<uint8_t*>(p);
      t.holder = std::shared_ptr<void>(file, t.data);
    } else {
      // Safetensors does not require aligned tensors (a writer keeping its input order after an
      // odd-sized u8/bf16 tensor leaves the next one misaligned); kernels load whole elements, so copy.
      Tensor c = Tensor::host(*dtype, t.shape);
      std::memcpy(c.data, p, nbytes);
      t = std::move(c);
    }
    f.tensors_.emplace(name, std::move(t));
  }

  // 3. No two tensors share bytes (a writer bug or a crafted file; writes through one would alias).
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end)
      fail("safetensors", "{}: tensors \"{}\" [{}, {}] and \"{}\" [{}, {}] overlap", where, clip(*ranges[i - 1].name),
           ranges[i - 1].begin, ranges[i - 1].end, clip(*ranges[i].name), ranges[i].begin, ranges[i].end);
  }
  return f;
}

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  KILN_ASSERT(false, "no safetensors name for dtype {}", static_cast<int>(t));
  return "?";
}

}  // namespace kiln::io
