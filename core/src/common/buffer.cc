#include "dtrain/buffer.h"

#include "dtrain/error.h"

namespace dtrain {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32: return 4;
    case DType::F64:
    case DType::I64: return 8;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I8:
    case DType::U8: return 1;
  }
  throw InvalidUsage("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  static const char* names[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"};
  int i = static_cast<int>(t);
  return (i >= 0 && i < kNumDTypes) ? names[i] : "unknown";
}

DType parse_dtype(const std::string& name) {
  static const std::pair<const char*, DType> aliases[] = {
      {"f32", DType::F32},     {"float32", DType::F32}, {"float", DType::F32},     {"f64", DType::F64},
      {"float64", DType::F64}, {"double", DType::F64},  {"f16", DType::F16},       {"float16", DType::F16},
      {"half", DType::F16},    {"bf16", DType::BF16},   {"bfloat16", DType::BF16}, {"i8", DType::I8},
      {"int8", DType::I8},     {"u8", DType::U8},       {"uint8", DType::U8},      {"i32", DType::I32},
      {"int32", DType::I32},   {"i64", DType::I64},     {"int64", DType::I64}};
  for (auto& [n, t] : aliases)
    if (name == n) return t;
  throw InvalidUsage("unknown dtype '" + name + "' (known: f32, f64, f16, bf16, i8, u8, i32, i64)");
}

bool is_floating(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; }

std::string Device::str() const { return type == DeviceType::CPU ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace dtrain
