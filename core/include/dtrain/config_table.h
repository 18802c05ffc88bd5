#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "dtrain/config.h"
#include "dtrain/error.h"

namespace dtrain {

// Binds config keys to the fields of a struct, as UCS's config tables bind
// {name, default, doc, offset, type}: a key is declared once, with its field,
// and its default is the field's own initializer in a default-constructed S,
// so the struct's C++ users and the job file share one default. declare()
// adds the keys (type, default text, doc, range) to a schema; read() fills a
// typed S from a Config, validated or not: an absent key keeps its field's
// initializer, a present key of the wrong type or out of range is a
// ConfigError at its file:line, as validate() reports it.
//
//   struct TrainOptions { int64_t epochs = 10; double lr = 0.1; };
//   ConfigTable<TrainOptions> t;
//   t.add("train.epochs", &TrainOptions::epochs, "passes over the data").at_least(1)
//    .add("train.lr", &TrainOptions::lr, "peak learning rate");
//   t.declare(schema);  TrainOptions o = t.read(config);
template <typename S>
class ConfigTable {
 public:
  ConfigTable& add(const std::string& path, bool S::*field, std::string doc) {
    return bind(path, ConfigType::Bool, S{}.*field ? "true" : "false", std::move(doc),
                [path, field](const Config& c, S& s) { s.*field = c.get_bool(path); });
  }
  ConfigTable& add(const std::string& path, int64_t S::*field, std::string doc) {
    return bind(path, ConfigType::Int, std::to_string(S{}.*field), std::move(doc),
                [path, field](const Config& c, S& s) { s.*field = c.get_int(path); });
  }
  ConfigTable& add(const std::string& path, int S::*field, std::string doc) {
    return bind(path, ConfigType::Int, std::to_string(S{}.*field), std::move(doc),
                [path, field](const Config& c, S& s) { s.*field = static_cast<int>(c.get_int(path)); });
  }
  ConfigTable& add(const std::string& path, double S::*field, std::string doc) {
    return bind(path, ConfigType::Float, float_literal(S{}.*field), std::move(doc),
                [path, field](const Config& c, S& s) { s.*field = c.get_float(path); });
  }
  ConfigTable& add(const std::string& path, std::string S::*field, std::string doc) {
    return bind(path, ConfigType::String, string_literal(S{}.*field), std::move(doc),
                [path, field](const Config& c, S& s) { s.*field = c.get_string(path); });
  }
  ConfigTable& add(const std::string& path, std::vector<int64_t> S::*field, std::string doc) {
    const S defaults{};
    std::string text = "[";
    for (int64_t v : defaults.*field) text += (text.size() > 1 ? ", " : "") + std::to_string(v);
    return bind(path, ConfigType::IntList, text + "]", std::move(doc),
                [path, field](const Config& c, S& s) { s.*field = c.get_int_list(path); });
  }
  ConfigTable& add(const std::string& path, std::vector<double> S::*field, std::string doc) {
    const S defaults{};
    std::string text = "[";
    for (double v : defaults.*field) text += (text.size() > 1 ? ", " : "") + float_literal(v);
    return bind(path, ConfigType::FloatList, text + "]", std::move(doc),
                [path, field](const Config& c, S& s) { s.*field = c.get_float_list(path); });
  }
  ConfigTable& add(const std::string& path, std::vector<std::string> S::*field, std::string doc) {
    const S defaults{};
    std::string text = "[";
    for (const auto& v : defaults.*field) text += (text.size() > 1 ? ", " : "") + string_literal(v);
    return bind(path, ConfigType::StringList, text + "]", std::move(doc),
                [path, field](const Config& c, S& s) { s.*field = c.get_string_list(path); });
  }
  // A key whose field needs a conversion (a name to an enum): its default
  // text must match what the field's initializer stands for.
  ConfigTable& add_read(const std::string& path, ConfigType type, std::string default_text, std::string doc,
                        std::function<void(const Config&, S&)> read) {
    return bind(path, type, std::move(default_text), std::move(doc), std::move(read));
  }
  // Bounds of the key added last (checked by validate() and by read()).
  ConfigTable& at_least(double min) { return in_range(min, HUGE_VAL); }
  ConfigTable& in_range(double min, double max) {
    keys_.back().min = min;
    keys_.back().max = max;
    return *this;
  }

  void declare(ConfigSchema& schema) const {
    for (const Key& k : keys_) {
      schema.add(k.path, k.type, k.default_text, k.doc);
      if (k.max != HUGE_VAL)
        schema.in_range(k.min, k.max);
      else if (k.min != -HUGE_VAL)
        schema.at_least(k.min);
    }
  }

  S read(const Config& config) const {
    S s;
    for (const Key& k : keys_) {
      if (!config.has(k.path)) continue;  // the field keeps its initializer: the declared default
      k.read(config, s);
      if (k.min != -HUGE_VAL || k.max != HUGE_VAL) {
        double v = config.get_float(k.path);
        if (v < k.min || v > k.max) {
          ConfigLocation loc = config.location_of(k.path);
          throw ConfigError(
              loc.file, loc.line, loc.column, k.path,
              "must be " +
                  (k.max == HUGE_VAL ? ">= " + number(k.min) : "in [" + number(k.min) + ", " + number(k.max) + "]") +
                  ", got " + number(v));
        }
      }
    }
    return s;
  }

 private:
  struct Key {
    std::string path;
    ConfigType type;
    std::string default_text, doc;
    std::function<void(const Config&, S&)> read;
    double min = -HUGE_VAL, max = HUGE_VAL;
  };
  ConfigTable& bind(const std::string& path, ConfigType type, std::string def, std::string doc,
                    std::function<void(const Config&, S&)> read) {
    keys_.push_back(Key{path, type, std::move(def), std::move(doc), std::move(read)});
    return *this;
  }
  static std::string float_literal(double d) {
    char buf[64];
    for (int precision = 1; precision <= 17; ++precision) {  // the shortest text that reads back as d
      std::snprintf(buf, sizeof buf, "%.*g", precision, d);
      if (std::strtod(buf, nullptr) == d) break;
    }
    std::string s = buf;
    if (s.find_first_of(".einn") == std::string::npos) s += ".0";
    return s;
  }
  static std::string number(double d) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", d);
    return buf;
  }
  static std::string string_literal(const std::string& v) {
    std::string out = "\"";
    for (char c : v) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return out + "\"";
  }
  std::vector<Key> keys_;
};

}  // namespace dtrain
