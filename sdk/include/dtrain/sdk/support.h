#pragma once
// Small helpers for plugin authors: the host's logger and store and the
// plugin's options; includes the rest of the header-only helpers (errors and
// dtypes, clocks and the deadline rule, f16/bf16 conversion, reduction
// kernels). Standard C++17 (plus POSIX clock_gettime) and TOML++ (compiled
// mode, linked through dtrain::sdk); nothing here crosses the ABI.

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <toml++/toml.h>

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
// key list, but the text may come from any host), and the plugin's key table
// (as passed to DTRAIN_EXPORT_BACKEND_V1), whose defaults are the one place a
// default is written:
//
//   int64_t chunk = init.options.get_int("chunk_bytes");  // set, else the table's default
//
// The in-tree plugins declare their keys with a ConfigTable (config_table.h),
// whose read() fills a struct through the getters with a fallback and checks
// each key's bound.
//
// A key the table does not declare, or declares without a default, is an
// error that names it; the getters with a fallback stay for keys no table
// declares. Values (and the table's defaults) are read by TOML++, the same
// parser as the core's job files: a value that is not of the asked type, or
// that does not fit, fails with DT_ERR_INVALID_USAGE naming the key, never a
// silent 0.
class Options {
 public:
  Options() = default;
  explicit Options(const char* text, const dt_config_key_v1_t* keys = nullptr, uint32_t num_keys = 0) {
    for (uint32_t i = 0; keys && i < num_keys; ++i)
      if (keys[i].name)
        declared_[keys[i].name] = {keys[i].type ? keys[i].type : "",
                                   keys[i].default_value ? keys[i].default_value : ""};
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
  // Set in the text (a declared default does not count).
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  // In the plugin's key table.
  bool declared(const std::string& key) const { return declared_.count(key) != 0; }

  // The value if set, else the key table's default.
  std::string get_string(const std::string& key) const { return as_string(key, literal(key, "string")); }
  // TOML integers: decimal with an optional sign, 0x / 0o / 0b, '_' between digits.
  int64_t get_int(const std::string& key) const { return as_int(key, literal(key, "int")); }
  // TOML floats (and integers): 1.5, -2e-3, inf, nan, '_' between digits.
  double get_float(const std::string& key) const { return as_float(key, literal(key, "float")); }
  bool get_bool(const std::string& key) const { return as_bool(key, literal(key, "bool")); }

  // The value if set, else fallback (for keys no table declares).
  std::string get_string(const std::string& key, const std::string& fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : as_string(key, {it->second, false});
  }
  int64_t get_int(const std::string& key, int64_t fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : as_int(key, {it->second, false});
  }
  double get_float(const std::string& key, double fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : as_float(key, {it->second, false});
  }
  bool get_bool(const std::string& key, bool fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : as_bool(key, {it->second, false});
  }

 private:
  struct Declared {
    std::string type, default_value;
  };
  struct Literal {
    std::string text;
    bool from_table;  // the key table's default, not a value the user set
  };

  // The text of key's value: set, else its declared default.
  Literal literal(const std::string& key, const char* type) const {
    auto d = declared_.find(key);
    if (d == declared_.end())
      fail(DT_ERR_INTERNAL, "option '" + key +
                                "' is not in the plugin's key table: declare it there (with its default), or read it "
                                "with a fallback");
    if (d->second.type != type)
      fail(DT_ERR_INTERNAL, "option '" + key + "' is declared as " + d->second.type + " but read as " + type);
    auto v = values_.find(key);
    if (v != values_.end()) return {v->second, false};
    if (d->second.default_value.empty())
      fail(DT_ERR_INVALID_USAGE, "option '" + key + "' is not set and has no default: set it in the plugin's table");
    return {d->second.default_value, true};
  }

  // The literal as TOML++ reads it ("v = <literal>"); null if it is not one.
  static std::optional<toml::table> parse(const std::string& literal) {
    try {
      return toml::parse("v = " + literal);
    } catch (const toml::parse_error&) {
      return std::nullopt;
    }
  }
  template <typename T>
  static std::optional<T> read(const Literal& l) {
    std::optional<toml::table> t = parse(l.text);
    if (!t || t->size() != 1) return std::nullopt;
    return (*t)["v"].value_exact<T>();
  }
  static std::string as_string(const std::string& key, const Literal& l) {
    if (auto v = read<std::string>(l)) return *v;
    bad(key, l, "a string");
  }
  static int64_t as_int(const std::string& key, const Literal& l) {
    if (auto v = read<int64_t>(l)) return *v;
    bad(key, l, "an integer (64-bit)");
  }
  static double as_float(const std::string& key, const Literal& l) {
    if (auto v = read<double>(l)) return *v;
    if (auto v = read<int64_t>(l)) return static_cast<double>(*v);
    bad(key, l, "a number");
  }
  static bool as_bool(const std::string& key, const Literal& l) {
    if (auto v = read<bool>(l)) return *v;
    bad(key, l, "true or false");
  }
  [[noreturn]] static void bad(const std::string& key, const Literal& l, const std::string& want) {
    if (l.from_table)
      fail(DT_ERR_INTERNAL,
           "the plugin's key table declares option '" + key + "' with default " + l.text + ", which is not " + want);
    fail(DT_ERR_INVALID_USAGE, "option '" + key + "' = " + l.text + " is not " + want);
  }
  static std::string trim(const std::string& s) {
    size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
  }
  std::map<std::string, std::string> values_;
  std::map<std::string, Declared> declared_;
};

}  // namespace dtrain::sdk
