// DType names and sizes, views, host allocation, and half-precision conversions.
#include "kiln/tensor/tensor.h"

#include <algorithm>
#include <cstring>

namespace kiln {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::u32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::u32: return "uint32";
    case DType::i32: return "int32";
    case DType::u8: return "uint8";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), ::tolower);
  if (n == "float32" || n == "f32" || n == "float") return DType::f32;
  if (n == "float16" || n == "f16" || n == "half") return DType::f16;
  if (n == "bfloat16" || n == "bf16") return DType::bf16;
  if (n == "uint32" || n == "u32") return DType::u32;
  if (n == "int32" || n == "i32") return DType::i32;
  if (n == "uint8" || n == "u8") return DType::u8;
  fail("tensor", "unknown dtype \"{}\" (expected float32, float16, bfloat16, uint32, int32 or uint8)", name);
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Tensor Tensor::view(Shape s) const {
  KILN_ASSERT(shape_numel(s) == numel(), "view {} of {}", shape_str(s), shape_str(shape));
  Tensor t = *this;
  t.shape = std::move(s);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  KILN_ASSERT(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape[0], "slice [{}, {}) of {}", begin, end, shape_str(shape));
  Tensor t = *this;
  size_t row_bytes = shape[0] == 0 ? 0 : nbytes() / shape[0];
  t.data = static_cast<char*>(data) + begin * row_bytes;
  t.shape[0] = end - begin;
  return t;
}

Tensor Tensor::host(DType t, Shape s) {
  Tensor r;
  r.dtype = t;
  r.shape = std::move(s);
  size_t bytes = std::max<size_t>(r.nbytes(), 1);
  // 64-byte aligned for SIMD loads.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  KILN_ASSERT(p, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  r.holder = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  r.data = p;
  return r;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; --exp; }
      u = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

void to_f32(const void* src, DType t, float* dst, int64_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, n * 4); break;
    case DType::bf16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      break;
    }
    case DType::f16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      break;
    }
    default: KILN_ASSERT(false, "to_f32 from {}", dtype_name(t));
  }
}

}  // namespace kiln
