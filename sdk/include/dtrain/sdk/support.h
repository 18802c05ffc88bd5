#pragma once
// Small helpers for plugin authors: the host's logger and store and the
// plugin's options; includes the rest of the header-only helpers (errors and
// dtypes, clocks and the deadline rule, f16/bf16 conversion, reduction
// kernels). Standard C++17 (plus POSIX clock_gettime); nothing here crosses
// the ABI.

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/sdk/clock.h"
#include "dtrain/sdk/error.h"
#include "dtrain/sdk/half.h"
#include "dtrain/sdk/reduce.h"

namespace dtrain::sdk {

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
    check(s_->wait(s_->ctx, k.data(), static_cast<uint32_t>(k.size()), timeout_ms), "wait",
          keys.empty() ? "" : keys[0]);
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

// The plugin's own options: the flat "key = literal" TOML text the core
// passes (the core has already checked names and types against the plugin's
// key list, but the text may come from any host). Values are read as typed
// TOML literals; a value that is not of the asked type, or that does not fit,
// fails with DT_ERR_INVALID_USAGE naming the key, never a silent 0.
class Options {
 public:
  Options() = default;
  explicit Options(const char* text) {
    if (!text) return;
    const char* p = text;
    int line_no = 0;
    while (*p) {
      const char* e = std::strchr(p, '\n');
      std::string line = e ? std::string(p, e) : std::string(p);
      p = e ? e + 1 : p + line.size();
      ++line_no;
      std::string t = trim(line);
      if (t.empty() || t[0] == '#') continue;
      auto eq = t.find('=');
      if (eq == std::string::npos || trim(t.substr(0, eq)).empty())
        fail(DT_ERR_INVALID_USAGE,
             "plugin options, line " + std::to_string(line_no) + ": '" + t + "' is not 'key = value'");
      values_[trim(t.substr(0, eq))] = trim(t.substr(eq + 1));
    }
  }
  bool has(const std::string& key) const { return values_.count(key) != 0; }

  std::string get_string(const std::string& key, const std::string& fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    const std::string& v = it->second;
    if (v.size() < 2 || (v[0] != '"' && v[0] != '\'') || v.back() != v[0]) bad(key, v, "a string");
    if (v[0] == '\'') return v.substr(1, v.size() - 2);
    std::string out;
    for (size_t i = 1; i + 1 < v.size(); ++i) {
      if (v[i] != '\\') {
        out += v[i];
        continue;
      }
      if (i + 2 >= v.size()) bad(key, v, "a string");
      char n = v[++i];
      switch (n) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'e': out += '\x1b'; break;
        case '"':
        case '\\': out += n; break;
        case 'u':
        case 'U': {
          size_t len = n == 'u' ? 4 : 8;
          if (i + len + 1 >= v.size()) bad(key, v, "a string");
          uint32_t cp = static_cast<uint32_t>(std::strtoul(v.substr(i + 1, len).c_str(), nullptr, 16));
          i += len;
          append_utf8(cp, &out);
          break;
        }
        default: bad(key, v, "a string (unknown escape \\" + std::string(1, n) + ")");
      }
    }
    return out;
  }

  // TOML integers: decimal with an optional sign, 0x / 0o / 0b, '_' between digits.
  int64_t get_int(const std::string& key, int64_t fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    const std::string& v = it->second;
    std::string digits;
    if (!strip_underscores(v, &digits) || digits.empty()) bad(key, v, "an integer");
    int base = 10;
    size_t start = (digits[0] == '+' || digits[0] == '-') ? 1 : 0;
    if (start == 0 && digits.size() > 2 && digits[0] == '0') {
      char b = digits[1];
      base = b == 'x' ? 16 : b == 'o' ? 8 : b == 'b' ? 2 : 10;
      if (base != 10) digits = digits.substr(2);
    }
    if (digits.size() <= start || !std::isalnum(static_cast<unsigned char>(digits[start]))) bad(key, v, "an integer");
    errno = 0;
    char* end = nullptr;
    long long r = std::strtoll(digits.c_str(), &end, base);
    if (*end != '\0') bad(key, v, "an integer");
    if (errno == ERANGE) bad(key, v, "an integer that fits in 64 bits");
    return r;
  }

  // TOML floats (and integers): 1.5, -2e-3, inf, nan, '_' between digits.
  double get_float(const std::string& key, double fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    const std::string& v = it->second;
    std::string digits;
    if (!strip_underscores(v, &digits) || digits.empty()) bad(key, v, "a number");
    std::string body = digits.substr(digits[0] == '+' || digits[0] == '-' ? 1 : 0);
    if (body == "inf" || body == "nan") return std::strtod(digits.c_str(), nullptr);
    if (body.empty() || !std::isdigit(static_cast<unsigned char>(body[0]))) bad(key, v, "a number");
    char* end = nullptr;
    double r = std::strtod(digits.c_str(), &end);
    if (*end != '\0' || body.find_first_of("xXpP") != std::string::npos) bad(key, v, "a number");
    return r;
  }

  bool get_bool(const std::string& key, bool fallback) const {
    auto it = values_.find(key);
    if (it == values_.end()) return fallback;
    if (it->second == "true") return true;
    if (it->second == "false") return false;
    bad(key, it->second, "true or false");
  }

 private:
  [[noreturn]] static void bad(const std::string& key, const std::string& value, const std::string& want) {
    fail(DT_ERR_INVALID_USAGE, "option '" + key + "' = " + value + " is not " + want);
  }
  static void append_utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xc0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xe0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      *out += static_cast<char>(0xf0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  // Drops TOML's digit separators; false if one is not between two digits.
  static bool strip_underscores(const std::string& v, std::string* out) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] != '_') {
        *out += v[i];
        continue;
      }
      if (i == 0 || i + 1 == v.size() || !std::isxdigit(static_cast<unsigned char>(v[i - 1])) ||
          !std::isxdigit(static_cast<unsigned char>(v[i + 1])))
        return false;
    }
    return true;
  }
  static std::string trim(const std::string& s) {
    size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
  }
  std::map<std::string, std::string> values_;
};

}  // namespace dtrain::sdk
