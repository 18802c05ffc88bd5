#pragma once
// Small helpers for plugin authors: the host's logger and store and the
// plugin's options; includes the rest of the header-only helpers (errors and
// dtypes, clocks and the deadline rule, f16/bf16 conversion, reduction
// kernels). Standard C++17 (plus POSIX clock_gettime); nothing here crosses
// the ABI.

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
