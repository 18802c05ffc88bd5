#pragma once
// TOML values as text, for Config and ConfigSchema: literals in and out, type
// names for messages, and a value's match against a declared ConfigType.
// Internal to the core (TOML++ stays out of the public headers).

#include <optional>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "dtrain/config.h"

namespace dtrain::config_text {

std::string quote_string(const std::string& s);
// A key as TOML writes it: bare when it can be, else quoted.
std::string format_key(const std::string& k);
// The shortest text that reads back as d, always with a '.' or an exponent.
std::string format_float(double d);
// A node as a TOML literal (strings quoted, arrays and inline tables nested).
std::string literal(const toml::node& node);
const char* toml_type_name(const toml::node& node);
// "string \"x\"", "integer 3": what a message says the user wrote.
std::string describe_value(const toml::node& node);
bool matches(ConfigType type, const toml::node& node);
// An integer or float node as a double.
double number_of(const toml::node& n);
// A bound as a message writes it: 1, not 1.0.
std::string literal_number(double d);
// Splits "a.b.c" (TOML key syntax, quoted parts allowed) into its parts.
std::optional<std::vector<std::string>> parse_key(const std::string& key_text);
// Parses one TOML value into a table {v = value}; nullopt if the text is not exactly one value.
std::optional<toml::table> parse_literal(const std::string& text);

}  // namespace dtrain::config_text
