#pragma once
// The plugin-side error type and the dtype/op vocabulary of the C ABI.
// Header-only, standard C++17.

#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include "dtrain/abi/backend_v1.h"

namespace dtrain::sdk {

// Throw this from plugin code; the trampolines turn it into its status and
// keep the message as the handle's last error. Any other exception becomes
// DT_ERR_INTERNAL with its what().
class Error : public std::runtime_error {
 public:
  Error(dt_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  dt_status_t status() const { return status_; }

 private:
  dt_status_t status_;
};

[[noreturn]] inline void fail(dt_status_t status, const std::string& message) { throw Error(status, message); }

inline size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case DT_DTYPE_F32:
    case DT_DTYPE_I32: return 4;
    case DT_DTYPE_F64:
    case DT_DTYPE_I64: return 8;
    case DT_DTYPE_F16:
    case DT_DTYPE_BF16: return 2;
    case DT_DTYPE_I8:
    case DT_DTYPE_U8: return 1;
  }
  fail(DT_ERR_INVALID_USAGE, "unknown dtype code " + std::to_string(dtype));
}

inline const char* dtype_name(int32_t dtype) {
  static const char* n[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"};
  return dtype >= 0 && dtype < DT_DTYPE_COUNT ? n[dtype] : "unknown";
}

inline const char* op_name(int32_t op) {
  static const char* n[] = {"sum", "avg", "max", "min", "prod"};
  return op >= 0 && op < DT_OP_COUNT ? n[op] : "unknown";
}

inline size_t bytes_of(const dt_buffer_v1_t& b) { return b.count * dtype_size(b.dtype); }

// Refuses a buffer that is not in host memory (for CPU-only plugins).
inline void require_cpu(const dt_buffer_v1_t& b, const char* backend) {
  if (b.device_type != DT_DEVICE_CPU)
    fail(DT_ERR_NOT_SUPPORTED, std::string(backend) + " backend works on CPU buffers only");
}
inline void require_cpu(const dt_buffer_v1_t& send, const dt_buffer_v1_t& recv, const char* backend) {
  require_cpu(send, backend);
  require_cpu(recv, backend);
}

namespace detail {
// Runs f (which returns a dt_status_t) and turns what it throws into a
// status, with the message in *err (when err is not null): no exception
// crosses the ABI or leaves a plugin thread.
template <typename F>
dt_status_t guarded(std::string* err, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (err) *err = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    if (err) *err = "out of memory";
    return DT_ERR_SYSTEM;
  } catch (const std::exception& e) {
    if (err) *err = e.what();
    return DT_ERR_INTERNAL;
  } catch (...) {
    if (err) *err = "unknown exception";
    return DT_ERR_INTERNAL;
  }
}
}  // namespace detail

}  // namespace dtrain::sdk
