#pragma once
// A plugin's keys, declared once: the SDK's ConfigTable (the core's
// dtrain/config_table.h for the [strategy] keys is the model). The plugin
// writes its options as a struct whose fields' initializers are the defaults,
// and one line per key binds a field to its name, its bound (optional) and
// its doc:
//
//   struct MyKeys {
//     std::string algorithm = "ring";
//     int64_t chunk_bytes = 131072;
//   };
//   const sdk::ConfigTable<MyKeys>& my_keys() {
//     static const sdk::ConfigTable<MyKeys> table("mine", {
//         {"algorithm", &MyKeys::algorithm, "ring or tree"},
//         {"chunk_bytes", &MyKeys::chunk_bytes, sdk::at_least(4096), "pipeline chunk"},
//     });
//     return table;
//   }
//   DTRAIN_EXPORT_BACKEND_V1_TABLE(MyComm, "mine", "1.0.0", "what it is", kCaps, my_keys())
//
//   // in MyComm's constructor: every key, the value set or its default, bounds checked
//   MyKeys k = my_keys().read(init.options);
//
// From that one declaration the table makes the dt_config_key_v1_t array of
// the C table (what the core validates names and types against, and what
// `dtrain plugins --keys` lists), and read() fills the struct. The frozen
// ABI's key struct has no field for a bound, so bounds stay on this side of
// it: the array's description ends with the bound ("pipeline chunk (at least
// 4096)"), and read() fails with DT_ERR_INVALID_USAGE naming the key, the
// value and the bound ("mine.chunk_bytes = 1024 is out of bounds: must be at
// least 4096"). A default outside its own bound is the plugin's bug
// (DT_ERR_INTERNAL).
//
// Field types: bool, std::string, float and double ("float" keys), and any
// other integral type ("int" keys; a value that does not fit the field's type
// fails like one out of bounds).

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <type_traits>
#include <vector>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/sdk/error.h"
#include "dtrain/sdk/support.h"

namespace dtrain::sdk {

// Inclusive bounds of an int or float key; an open side is infinite.
struct Bound {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();

  bool bounded() const { return std::isfinite(min) || std::isfinite(max); }
  bool contains(double v) const { return v >= min && v <= max; }  // NaN is in no bound
  // "at least 4096", "at most 10", "in [1, 64]"; "" when unbounded.
  std::string text() const {
    if (std::isfinite(min) && std::isfinite(max)) return "in [" + number(min) + ", " + number(max) + "]";
    if (std::isfinite(min)) return "at least " + number(min);
    if (std::isfinite(max)) return "at most " + number(max);
    return "";
  }
  static std::string number(double d) {
    char buf[64];
    if (d == std::floor(d) && std::fabs(d) < 1e18) {
      std::snprintf(buf, sizeof buf, "%.0f", d);
    } else {
      for (int precision = 1; precision <= 17; ++precision) {  // the shortest text that reads back as d
        std::snprintf(buf, sizeof buf, "%.*g", precision, d);
        if (std::strtod(buf, nullptr) == d) break;
      }
    }
    return buf;
  }
};
inline Bound at_least(double min) { return Bound{min, std::numeric_limits<double>::infinity()}; }
inline Bound at_most(double max) { return Bound{-std::numeric_limits<double>::infinity(), max}; }
inline Bound in_range(double min, double max) { return Bound{min, max}; }

template <typename S>
class ConfigTable {
 public:
  // One key: {name, &S::field, doc} or {name, &S::field, bound, doc}.
  class Key {
   public:
    template <typename T>
    Key(const char* name, T S::*field, const char* doc) : Key(name, field, Bound{}, doc) {}
    template <typename T>
    Key(const char* name, T S::*field, Bound bound, const char* doc) : name_(name), doc_(doc), bound_(bound) {
      const S defaults{};
      bind(field, defaults.*field);
    }

    const std::string& name() const { return name_; }
    const char* type() const { return type_; }
    const std::string& default_text() const { return default_text_; }
    const std::string& doc() const { return doc_; }
    const Bound& bound() const { return bound_; }

   private:
    friend class ConfigTable;
    using Reader = std::function<void(const std::string& plugin, const Key& key, const Options& o, S& s)>;

    void bind(bool S::*field, bool def) {
      type_ = "bool";
      default_text_ = def ? "true" : "false";
      read_ = [field](const std::string&, const Key& k, const Options& o, S& s) {
        s.*field = o.get_bool(k.name_, s.*field);
      };
    }
    void bind(std::string S::*field, const std::string& def) {
      type_ = "string";
      default_text_ = string_literal(def);
      read_ = [field](const std::string&, const Key& k, const Options& o, S& s) {
        s.*field = o.get_string(k.name_, s.*field);
      };
    }
    template <typename T>
    void bind(T S::*field, T def) {
      static_assert(std::is_arithmetic_v<T>, "a ConfigTable field is bool, std::string, a float or an integer");
      if constexpr (std::is_floating_point_v<T>) {
        type_ = "float";
        default_text_ = float_literal(static_cast<double>(def));
        read_ = [field](const std::string& plugin, const Key& k, const Options& o, S& s) {
          double v = o.get_float(k.name_, static_cast<double>(s.*field));
          if (!k.bound_.contains(v)) k.out_of_bounds(plugin, o, Bound::number(v), k.bound_.text());
          s.*field = static_cast<T>(v);
        };
      } else {
        type_ = "int";
        default_text_ = std::to_string(def);
        read_ = [field](const std::string& plugin, const Key& k, const Options& o, S& s) {
          int64_t v = o.get_int(k.name_, static_cast<int64_t>(s.*field));
          if (!k.bound_.contains(static_cast<double>(v)))
            k.out_of_bounds(plugin, o, std::to_string(v), k.bound_.text());
          if (!fits<T>(v))
            k.out_of_bounds(plugin, o, std::to_string(v),
                            "in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                                std::to_string(std::numeric_limits<T>::max()) + "]");
          s.*field = static_cast<T>(v);
        };
      }
    }

    template <typename T>
    static bool fits(int64_t v) {
      if constexpr (std::is_signed_v<T>) {
        return v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
               v <= static_cast<int64_t>(std::numeric_limits<T>::max());
      } else {
        return v >= 0 && static_cast<uint64_t>(v) <= static_cast<uint64_t>(std::numeric_limits<T>::max());
      }
    }
    [[noreturn]] void out_of_bounds(const std::string& plugin, const Options& o, const std::string& value,
                                    const std::string& bound) const {
      if (!o.has(name_))
        fail(DT_ERR_INTERNAL, "the plugin's key table declares " + plugin + "." + name_ + " with default " + value +
                                  ", outside its bound: " + bound);
      fail(DT_ERR_INVALID_USAGE, plugin + "." + name_ + " = " + value + " is out of bounds: must be " + bound);
    }
    static std::string string_literal(const std::string& v) {
      std::string out = "\"";
      for (char c : v) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      return out + "\"";
    }
    static std::string float_literal(double d) {
      std::string s = Bound::number(d);
      if (s.find_first_of(".einn") == std::string::npos) s += ".0";
      return s;
    }

    std::string name_;
    std::string doc_;
    Bound bound_;
    const char* type_ = "";
    std::string default_text_;
    Reader read_;
  };

  // plugin: the plugin's name, as its job-file table ("[ucx]"), in messages.
  ConfigTable(const char* plugin, std::initializer_list<Key> keys) : plugin_(plugin), keys_(keys) {
    docs_.reserve(keys_.size());
    abi_.reserve(keys_.size());
    for (const Key& k : keys_) {
      docs_.push_back(k.bound_.bounded() ? k.doc_ + " (" + k.bound_.text() + ")" : k.doc_);
      abi_.push_back(dt_config_key_v1_t{k.name_.c_str(), k.type_, k.default_text_.c_str(), docs_.back().c_str()});
    }
  }
  // The C array points into this object: it stays where it was built.
  ConfigTable(const ConfigTable&) = delete;
  ConfigTable& operator=(const ConfigTable&) = delete;

  // The keys for DTRAIN_EXPORT_BACKEND_V1_TABLE (dt_backend_v1_t.config_keys).
  const dt_config_key_v1_t* abi_keys() const { return abi_.data(); }
  uint32_t num_keys() const { return static_cast<uint32_t>(abi_.size()); }
  const std::vector<Key>& keys() const { return keys_; }
  const std::string& plugin() const { return plugin_; }

  // Every key: the value set in o, else the field's initializer; each checked
  // against its type and bound (an error names the key, the value and the bound).
  S read(const Options& o) const {
    S s{};
    for (const Key& k : keys_) k.read_(plugin_, k, o, s);
    return s;
  }

 private:
  std::string plugin_;
  std::vector<Key> keys_;
  std::vector<std::string> docs_;  // each key's doc and bound, as the C array shows it
  std::vector<dt_config_key_v1_t> abi_;
};

// A key whose text names one of an enum's values: the value of `text` in
// `names`; an unknown name fails (invalid usage) naming the key and the names
// it accepts.
template <typename E>
E parse_name(const std::string& key, const std::string& text, std::initializer_list<std::pair<const char*, E>> names) {
  std::string known;
  size_t i = 0;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    if (i > 0) known += i + 1 == names.size() ? " or " : ", ";
    known += std::string("\"") + name + "\"";
    ++i;
  }
  fail(DT_ERR_INVALID_USAGE, key + " = \"" + text + "\" is not known; use " + known);
}

}  // namespace dtrain::sdk
