#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dtrain {

// Values match DT_DTYPE_* of the plugin ABI.
enum class DType : int32_t { F32 = 0, F64 = 1, F16 = 2, BF16 = 3, I8 = 4, U8 = 5, I32 = 6, I64 = 7 };
constexpr int kNumDTypes = 8;

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "f32", "float32", "bf16", ... ; throws InvalidUsage listing the known names.
DType parse_dtype(const std::string& name);
bool is_floating(DType t);

enum class DeviceType : int32_t { CPU = 0, CUDA = 1 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i) { return {DeviceType::CUDA, i}; }
  std::string str() const;
};

// A non-owning view of typed memory. The caller keeps the memory alive and
// untouched until the Work that uses it has completed.
struct Buffer {
  void* ptr = nullptr;
  size_t count = 0;  // elements
  DType dtype = DType::F32;
  Device device;
  void* stream = nullptr;  // cudaStream_t for CUDA buffers

  Buffer() = default;
  Buffer(void* p, size_t n, DType t, Device d = Device::cpu(), void* s = nullptr)
      : ptr(p), count(n), dtype(t), device(d), stream(s) {}
  template <typename T>
  static Buffer of(T* p, size_t n);
  size_t bytes() const { return count * dtype_size(dtype); }
};

// The DType of a C++ element type (float, double, int8_t, uint8_t, int32_t, int64_t).
template <typename T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<U, double>)
    return DType::F64;
  else if constexpr (std::is_same_v<U, int8_t>)
    return DType::I8;
  else if constexpr (std::is_same_v<U, uint8_t>)
    return DType::U8;
  else if constexpr (std::is_same_v<U, int32_t>)
    return DType::I32;
  else if constexpr (std::is_same_v<U, int64_t>)
    return DType::I64;
  else
    static_assert(sizeof(U) == 0, "Buffer::of: no DType for this element type");
}

template <typename T>
Buffer Buffer::of(T* p, size_t n) {
  return Buffer(p, n, dtype_of<T>());
}

}  // namespace dtrain
