#pragma once

// Helpers shared by the store implementations (memory, file, tcp).

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/store.h"

namespace dtrain::store_detail {

using Clock = std::chrono::steady_clock;

// Longest wait honoured; longer timeouts (e.g. milliseconds::max()) are clamped so
// deadline arithmetic cannot overflow.
constexpr std::chrono::milliseconds kMaxWait{std::chrono::hours(24 * 365)};

inline std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds t) {
  if (t.count() < 0) return std::chrono::milliseconds(0);
  return t > kMaxWait ? kMaxWait : t;
}

inline Clock::time_point deadline_after(std::chrono::milliseconds t) { return Clock::now() + clamp_timeout(t); }

inline std::string quote_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) s += ", ";
    s += "'" + keys[i] + "'";
  }
  return s;
}

inline std::string timeout_message(const std::vector<std::string>& missing, std::chrono::milliseconds timeout,
                                   const std::string& where) {
  return "timed out after " + std::to_string(timeout.count()) + " ms waiting for key" +
         (missing.size() == 1 ? " " : "s ") + quote_keys(missing) + " in " + where;
}

inline int64_t parse_counter(const std::string& key, const Bytes& value) {
  std::string text(value.begin(), value.end());
  if (text.empty()) return 0;
  size_t i = (text[0] == '-' || text[0] == '+') ? 1 : 0;
  bool ok = i < text.size() && text.size() <= 20;
  for (size_t j = i; ok && j < text.size(); ++j) ok = text[j] >= '0' && text[j] <= '9';
  if (ok) {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == 0 && end == text.c_str() + text.size()) return v;
  }
  if (text.size() > 40) text = text.substr(0, 40) + "...";
  throw InvalidUsage("store key '" + key + "' holds '" + text + "', not a decimal integer: add() cannot update it");
}

inline int64_t checked_add(const std::string& key, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw InvalidUsage("store add() on key '" + key + "' overflows: " + std::to_string(a) + " + " + std::to_string(b));
  return r;
}

inline Bytes format_counter(int64_t v) {
  std::string s = std::to_string(v);
  return Bytes(s.begin(), s.end());
}

}  // namespace dtrain::store_detail
