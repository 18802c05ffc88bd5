#include "config/toml_text.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "dtrain/sdk/strings.h"

namespace dtrain::config_text {

using sdk::trim;

std::string quote_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string format_key(const std::string& k) {
  bool bare = !k.empty() &&
              std::all_of(k.begin(), k.end(), [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
  return bare ? k : quote_string(k);
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string literal(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return quote_string(node.as_string()->get());
    case toml::node_type::integer: return std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point: return format_float(node.as_floating_point()->get());
    case toml::node_type::boolean: return node.as_boolean()->get() ? "true" : "false";
    case toml::node_type::array: {
      std::string out = "[";
      bool first = true;
      for (const toml::node& e : *node.as_array()) {
        if (!first) out += ", ";
        first = false;
        out += literal(e);
      }
      return out + "]";
    }
    case toml::node_type::table: {
      const toml::table& t = *node.as_table();
      if (t.empty()) return "{}";
      std::string out = "{ ";
      bool first = true;
      for (auto&& [k, v] : t) {
        if (!first) out += ", ";
        first = false;
        out += format_key(std::string(k.str())) + " = " + literal(v);
      }
      return out + " }";
    }
    default: {
      std::ostringstream os;
      os << toml::toml_formatter(node);
      return os.str();
    }
  }
}

const char* toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "int";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "bool";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "datetime";
    case toml::node_type::array: return "array";
    case toml::node_type::table: return "table";
    default: return "nothing";
  }
}

std::string describe_value(const toml::node& node) {
  if (node.is_table()) return "table";
  std::string text = literal(node);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return std::string(toml_type_name(node)) + " " + text;
}

namespace {
bool all_of_type(const toml::node& node, toml::node_type type) {
  const toml::array* a = node.as_array();
  if (!a) return false;
  return std::all_of(a->begin(), a->end(), [&](const toml::node& e) { return e.type() == type; });
}

}  // namespace

bool matches(ConfigType type, const toml::node& node) {
  switch (type) {
    case ConfigType::String: return node.is_string();
    case ConfigType::Int: return node.is_integer();
    case ConfigType::Float: return node.is_floating_point() || node.is_integer();
    case ConfigType::Bool: return node.is_boolean();
    case ConfigType::StringList: return all_of_type(node, toml::node_type::string);
    case ConfigType::IntList: return all_of_type(node, toml::node_type::integer);
    case ConfigType::FloatList: {
      const toml::array* a = node.as_array();
      return a && std::all_of(a->begin(), a->end(),
                              [](const toml::node& e) { return e.is_floating_point() || e.is_integer(); });
    }
    case ConfigType::Table: return node.is_table();
  }
  return false;
}

using sdk::levenshtein;  // dtrain/sdk/strings.h

double number_of(const toml::node& n) {
  return n.is_integer() ? static_cast<double>(n.as_integer()->get()) : n.as_floating_point()->get();
}

std::string literal_number(double d) {
  if (d == std::floor(d) && std::fabs(d) < 1e15) return std::to_string(static_cast<long long>(d));
  return format_float(d);
}

std::optional<std::vector<std::string>> parse_key(const std::string& key_text) {
  if (trim(key_text).empty()) return std::nullopt;
  try {
    toml::table t = toml::parse(std::string_view(key_text + " = 0"), std::string_view("key"));
    std::vector<std::string> parts;
    const toml::table* cur = &t;
    while (true) {
      if (cur->size() != 1) return std::nullopt;
      auto it = cur->begin();
      parts.emplace_back(it->first.str());
      if (it->second.is_table()) {
        cur = it->second.as_table();
      } else {
        break;
      }
    }
    return parts;
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

std::optional<toml::table> parse_literal(const std::string& text) {
  if (trim(text).empty()) return std::nullopt;
  try {
    toml::table t = toml::parse(std::string_view("v = " + text + "\n"), std::string_view("literal"));
    if (t.size() != 1 || !t.contains("v")) return std::nullopt;
    return t;
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

}  // namespace dtrain::config_text
