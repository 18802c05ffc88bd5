#pragma once
// Small helpers for plugin authors: errors, the host's logger and store, the
// plugin's options, dtype sizes and reduced-precision conversions. Header-only,
// standard C++17 (plus POSIX clock_gettime where available); nothing here
// crosses the ABI.

#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/abi/backend_v1.h"

namespace dtrain::sdk {

// steady_clock's time from CLOCK_MONOTONIC_COARSE (libstdc++'s steady_clock is
// CLOCK_MONOTONIC: the same epoch), at most a scheduler tick behind, several
// times cheaper to read. For op deadlines, not for intervals under a tick.
inline std::chrono::steady_clock::time_point coarse_now() {
#ifdef CLOCK_MONOTONIC_COARSE
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
#else
  return std::chrono::steady_clock::now();
#endif
}

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
    case DT_DTYPE_F32: case DT_DTYPE_I32: return 4;
    case DT_DTYPE_F64: case DT_DTYPE_I64: return 8;
    case DT_DTYPE_F16: case DT_DTYPE_BF16: return 2;
    case DT_DTYPE_I8: case DT_DTYPE_U8: return 1;
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

// IEEE half <-> float (round to nearest even).
inline float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; --exp; }
      man &= 0x3ff;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0));
  if (exp >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    man |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (man >> 13);
  uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN stays NaN
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

namespace detail {
template <typename T, typename F>
inline void apply(void* c, const void* a, const void* b, size_t n, F f) {
  T* pc = static_cast<T*>(c);
  const T* pa = static_cast<const T*>(a);
  const T* pb = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) pc[i] = f(pa[i], pb[i]);
}
template <typename T>
inline void reduce_typed(int32_t op, void* c, const void* a, const void* b, size_t n) {
  switch (op) {
    case DT_OP_SUM: case DT_OP_AVG: apply<T>(c, a, b, n, [](T x, T y) { return static_cast<T>(x + y); }); return;
    case DT_OP_PROD: apply<T>(c, a, b, n, [](T x, T y) { return static_cast<T>(x * y); }); return;
    case DT_OP_MAX: apply<T>(c, a, b, n, [](T x, T y) { return x < y ? y : x; }); return;
    case DT_OP_MIN: apply<T>(c, a, b, n, [](T x, T y) { return y < x ? y : x; }); return;
  }
  fail(DT_ERR_INVALID_USAGE, "unknown reduction op code " + std::to_string(op));
}
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
inline void reduce_16(int32_t op, void* c, const void* a, const void* b, size_t n) {
  auto* pc = static_cast<uint16_t*>(c);
  auto* pa = static_cast<const uint16_t*>(a);
  auto* pb = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    float x = ToF(pa[i]), y = ToF(pb[i]), r;
    switch (op) {
      case DT_OP_SUM: case DT_OP_AVG: r = x + y; break;
      case DT_OP_PROD: r = x * y; break;
      case DT_OP_MAX: r = x < y ? y : x; break;
      case DT_OP_MIN: r = y < x ? y : x; break;
      default: fail(DT_ERR_INVALID_USAGE, "unknown reduction op code " + std::to_string(op));
    }
    pc[i] = FromF(r);
  }
}
}  // namespace detail

// Element-wise c[i] = op(a[i], b[i]) for any dtype (c may alias a or b). AVG
// reduces as SUM; the caller divides at the end with scale_avg().
inline void reduce_into(int32_t dtype, int32_t op, void* c, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DT_DTYPE_F32: return detail::reduce_typed<float>(op, c, a, b, n);
    case DT_DTYPE_F64: return detail::reduce_typed<double>(op, c, a, b, n);
    case DT_DTYPE_I8: return detail::reduce_typed<int8_t>(op, c, a, b, n);
    case DT_DTYPE_U8: return detail::reduce_typed<uint8_t>(op, c, a, b, n);
    case DT_DTYPE_I32: return detail::reduce_typed<int32_t>(op, c, a, b, n);
    case DT_DTYPE_I64: return detail::reduce_typed<int64_t>(op, c, a, b, n);
    case DT_DTYPE_F16: return detail::reduce_16<half_to_float, float_to_half>(op, c, a, b, n);
    case DT_DTYPE_BF16: return detail::reduce_16<bf16_to_float, float_to_bf16>(op, c, a, b, n);
  }
  fail(DT_ERR_INVALID_USAGE, "unknown dtype code " + std::to_string(dtype));
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

// The host's logger, captured by the entry point.
class Log {
 public:
  static void set_host(const dt_host_v1_t* h) { host() = h; }
  static void write(int32_t level, const std::string& msg) {
    if (auto* h = host(); h && h->log) h->log(h->ctx, level, msg.c_str());
  }
  static void info(const std::string& m) { write(DT_LOG_INFO, m); }
  static void warn(const std::string& m) { write(DT_LOG_WARN, m); }
  static void debug(const std::string& m) { write(DT_LOG_DEBUG, m); }

 private:
  static const dt_host_v1_t*& host() {
    static const dt_host_v1_t* h = nullptr;
    return h;
  }
};

// The core's rendezvous store, as seen by a plugin (keys already scoped).
class Store {
 public:
  Store() = default;
  explicit Store(const dt_store_v1_t* s) : s_(s) {}
  void set(const std::string& key, const std::string& value) const {
    check(s_->set(s_->ctx, key.c_str(), value.data(), value.size()), "set", key);
  }
  std::string get(const std::string& key, int64_t timeout_ms) const {
    void* v = nullptr;
    uint64_t n = 0;
    check(s_->get(s_->ctx, key.c_str(), timeout_ms, &v, &n), "get", key);
    std::string out(static_cast<const char*>(v), n);
    s_->free_value(s_->ctx, v);
    return out;
  }
  int64_t add(const std::string& key, int64_t delta) const {
    int64_t r = 0;
    check(s_->add(s_->ctx, key.c_str(), delta, &r), "add", key);
    return r;
  }
  void wait(const std::vector<std::string>& keys, int64_t timeout_ms) const {
    std::vector<const char*> k;
    for (auto& s : keys) k.push_back(s.c_str());
    check(s_->wait(s_->ctx, k.data(), static_cast<uint32_t>(k.size()), timeout_ms), "wait", keys.empty() ? "" : keys[0]);
  }
  void remove(const std::string& key) const { check(s_->remove(s_->ctx, key.c_str()), "remove", key); }
  bool valid() const { return s_ != nullptr; }

 private:
  static void check(dt_status_t st, const char* what, const std::string& key) {
    if (st == DT_OK) return;
    fail(st == DT_ERR_TIMEOUT ? DT_ERR_TIMEOUT : DT_ERR_SYSTEM,
         std::string("store ") + what + " of key '" + key + "' failed" +
             (st == DT_ERR_TIMEOUT ? " (timed out waiting for the other ranks)" : ""));
  }
  const dt_store_v1_t* s_ = nullptr;
};

// The plugin's own options: the flat "key = literal" text the core passes.
// The core has already checked names and types against the plugin's key list.
class Options {
 public:
  Options() = default;
  explicit Options(const char* text) {
    if (!text) return;
    const char* p = text;
    while (*p) {
      const char* e = std::strchr(p, '\n');
      std::string line = e ? std::string(p, e) : std::string(p);
      p = e ? e + 1 : p + line.size();
      auto eq = line.find('=');
      if (eq == std::string::npos) continue;
      values_[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
    }
  }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  std::string get_string(const std::string& key, const std::string& fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    return unquote(it->second);
  }
  int64_t get_int(const std::string& key, int64_t fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    std::string v;
    for (char c : it->second)
      if (c != '_') v += c;
    return std::strtoll(v.c_str(), nullptr, 0);
  }
  double get_float(const std::string& key, double fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : std::strtod(it->second.c_str(), nullptr);
  }
  bool get_bool(const std::string& key, bool fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : it->second == "true";
  }

 private:
  static std::string trim(const std::string& s) {
    size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
  }
  static std::string unquote(const std::string& v) {
    if (v.size() >= 2 && (v[0] == '"' || v[0] == '\'') && v.back() == v[0]) {
      std::string out;
      for (size_t i = 1; i + 1 < v.size(); ++i) {
        if (v[0] == '"' && v[i] == '\\' && i + 2 < v.size()) {
          char n = v[++i];
          out += n == 'n' ? '\n' : n == 't' ? '\t' : n;
        } else {
          out += v[i];
        }
      }
      return out;
    }
    return v;
  }
  std::map<std::string, std::string> values_;
};

}  // namespace dtrain::sdk
