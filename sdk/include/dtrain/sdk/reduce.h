#pragma once
// Element-wise reduction kernels, one loop per (dtype, op), written for the
// vectoriser; f16 and bf16 reduce through float. Header-only: the kernels are
// compiled in the plugin that includes this, with its flags, so build it with
// -O3 (and, on x86-64, at least -march=x86-64-v2) where reductions are an
// inner loop; dtrain's own CPU plugins do.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "dtrain/sdk/error.h"
#include "dtrain/sdk/half.h"

namespace dtrain::sdk {

// c[i] = op(a[i], b[i]) for i < n. c may equal a or b exactly, or be disjoint
// from both (no other overlap).
using ReduceFn = void (*)(void* c, const void* a, const void* b, size_t n);

namespace reduce_detail {

struct Sum {
  template <typename T>
  static T f(T a, T b) {
    return static_cast<T>(a + b);
  }
};
struct Prod {
  template <typename T>
  static T f(T a, T b) {
    return static_cast<T>(a * b);
  }
};
struct Max {
  template <typename T>
  static T f(T a, T b) {
    return a < b ? b : a;
  }
};
struct Min {
  template <typename T>
  static T f(T a, T b) {
    return b < a ? b : a;
  }
};

// c equal to a or b, or disjoint from both: no loop-carried dependence.
template <typename T, typename Op>
void kernel(void* c, const void* a, const void* b, size_t n) {
  T* pc = static_cast<T*>(c);
  const T* pa = static_cast<const T*>(a);
  const T* pb = static_cast<const T*>(b);
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) pc[i] = Op::f(pa[i], pb[i]);
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), typename Op>
void kernel16(void* c, const void* a, const void* b, size_t n) {
  auto* pc = static_cast<uint16_t*>(c);
  auto* pa = static_cast<const uint16_t*>(a);
  auto* pb = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) pc[i] = FromF(Op::f(ToF(pa[i]), ToF(pb[i])));
}

template <typename Op>
ReduceFn pick_type(int32_t dtype) {
  switch (dtype) {
    case DT_DTYPE_F32: return kernel<float, Op>;
    case DT_DTYPE_F64: return kernel<double, Op>;
    case DT_DTYPE_I8: return kernel<int8_t, Op>;
    case DT_DTYPE_U8: return kernel<uint8_t, Op>;
    case DT_DTYPE_I32: return kernel<int32_t, Op>;
    case DT_DTYPE_I64: return kernel<int64_t, Op>;
    case DT_DTYPE_F16: return kernel16<half_to_float, float_to_half, Op>;
    case DT_DTYPE_BF16: return kernel16<bf16_to_float, float_to_bf16, Op>;
  }
  fail(DT_ERR_INVALID_USAGE, "unknown dtype code " + std::to_string(dtype));
}

}  // namespace reduce_detail

// The kernel for (dtype, op); AVG reduces as SUM (divide at the end with
// scale_avg). Throws DT_ERR_INVALID_USAGE for codes it does not know, so a
// plugin can call it at submission to refuse bad arguments early.
inline ReduceFn reduce_fn(int32_t dtype, int32_t op) {
  using namespace reduce_detail;
  switch (op) {
    case DT_OP_SUM:
    case DT_OP_AVG: return pick_type<Sum>(dtype);
    case DT_OP_PROD: return pick_type<Prod>(dtype);
    case DT_OP_MAX: return pick_type<Max>(dtype);
    case DT_OP_MIN: return pick_type<Min>(dtype);
  }
  fail(DT_ERR_INVALID_USAGE, "unknown reduction op code " + std::to_string(op));
}

// c[i] = op(a[i], b[i]) for any dtype (see reduce_fn).
inline void reduce_into(int32_t dtype, int32_t op, void* c, const void* a, const void* b, size_t n) {
  reduce_fn(dtype, op)(c, a, b, n);
}

// x[i] /= world for AVG (integers truncate toward zero).
inline void scale_avg(int32_t dtype, void* x, size_t n, int world) {
  auto div = [&](auto* p) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::remove_reference_t<decltype(p[i])>>(p[i] / world);
  };
  switch (dtype) {
    case DT_DTYPE_F32: return div(static_cast<float*>(x));
    case DT_DTYPE_F64: return div(static_cast<double*>(x));
    case DT_DTYPE_I8: return div(static_cast<int8_t*>(x));
    case DT_DTYPE_U8: return div(static_cast<uint8_t*>(x));
    case DT_DTYPE_I32: return div(static_cast<int32_t*>(x));
    case DT_DTYPE_I64: return div(static_cast<int64_t*>(x));
    case DT_DTYPE_F16: {
      auto* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_half(half_to_float(p[i]) / world);
      return;
    }
    case DT_DTYPE_BF16: {
      auto* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / world);
      return;
    }
  }
  fail(DT_ERR_INVALID_USAGE, "unknown dtype code " + std::to_string(dtype));
}

}  // namespace dtrain::sdk
