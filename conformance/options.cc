#include "options.h"

#include <regex>

#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"

namespace dtrain::conformance {

namespace {

bool is_toml_literal(const std::string& v) {
  if (v == "true" || v == "false") return true;
  if (!v.empty() && (v[0] == '"' || v[0] == '\'' || v[0] == '[' || v[0] == '{')) return true;
  static const std::regex num(R"([+-]?(\d[\d_]*)(\.\d[\d_]*)?([eE][+-]?\d+)?|0x[0-9a-fA-F_]+|[+-]?(inf|nan))");
  return std::regex_match(v, num);
}

std::string toml_quote(const std::string& v) {
  std::string r = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r + "\"";
}

}  // namespace

std::vector<OptionLine> parse_option_items(const std::vector<std::string>& items) {
  std::vector<OptionLine> out;
  for (const auto& kv : items) {
    auto eq = kv.find('=');
    if (eq == std::string::npos) throw InvalidUsage("--option '" + kv + "' must look like key=value");
    std::string key = sdk::trim(kv.substr(0, eq)), value = sdk::trim(kv.substr(eq + 1));
    if (key.empty()) throw InvalidUsage("--option '" + kv + "' has an empty key");
    out.push_back({key, is_toml_literal(value) ? value : toml_quote(value)});
  }
  return out;
}

std::string options_to_toml(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& l : parse_option_items(items)) out += l.key + " = " + l.literal + "\n";
  return out;
}

}  // namespace dtrain::conformance
