#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::I8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::U8;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::I64;
};

template <typename T>
Buffer Buffer::of(T* p, size_t n) {
  return Buffer(p, n, DTypeOf<T>::value);
}

}  // namespace dtrain
