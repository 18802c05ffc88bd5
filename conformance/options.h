#pragma once
// Command-line backend options (`--option key=value`) as the plugin's flat
// TOML table text. Used by dtrain-conformance and dtrain-bench.

#include <string>
#include <utility>
#include <vector>

namespace dtrain::conformance {

struct OptionLine {
  std::string key;
  std::string literal;  // a TOML literal: the value as given if it is one, else quoted
};

// Parses "key=value" items (spaces around both trimmed). A value that already
// is a TOML literal (true/false, a number, a quoted string, an array or inline
// table) is kept; anything else becomes a quoted string. Throws InvalidUsage
// naming the item when it is not key=value.
std::vector<OptionLine> parse_option_items(const std::vector<std::string>& items);

// "key = literal\n" for each item: the text a plugin's Options reads.
std::string options_to_toml(const std::vector<std::string>& items);

}  // namespace dtrain::conformance
