// Tensor: plain data, no ops. A typed, shaped, row-major view of memory on one device, which
// keeps its storage alive through a shared holder (an mmap, a host vector, a device buffer).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/base/error.h"

namespace kiln {

enum class DType : uint8_t { f32, f16, bf16, u32, i32, u8 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "float32"/"f32"/"F32", "bfloat16"/"bf16"/"BF16", ...; throws [tensor] on unknown names.
DType dtype_from_name(const std::string& name);

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Device device = Device::cpu;
  std::shared_ptr<void> holder;  // keeps `data` alive; empty for borrowed views

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  // Elements per row (the last dimension) and rows (the product of the others).
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }

  // Same memory, new shape (numel must match).
  Tensor view(Shape s) const;
  // Rows [begin, end) along the first dimension, without copying.
  Tensor slice_rows(int64_t begin, int64_t end) const;

  // A new host tensor (zero-filled) owning its memory.
  static Tensor host(DType t, Shape s);
};

// bf16/f16 <-> f32 conversions (bf16 is the high half of an f32; f16 is IEEE binary16).
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n values of any float dtype to f32 (host memory).
void to_f32(const void* src, DType t, float* dst, int64_t n);

}  // namespace kiln
