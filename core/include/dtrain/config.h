#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain {

// Job configuration from a TOML file (TOML++ inside; no TOML++ type leaks out).
//
// Loading: syntax errors throw ConfigError with file, line and column.
// Overrides "-o a.b.c=value": the value is parsed as a TOML literal (42, 0.5,
// true, "text", [1, 2]); if it does not parse, it is taken as a string. Tables
// on the way are created. A bad override throws ConfigError whose file is
// "-o a.b.c=value".
//
// Validation against a ConfigSchema: every key in the document must be known
// (else ConfigError "unknown key 'train.epoch'; did you mean 'train.epochs'?"
// with its file/line/column), every known key's value must have its type
// (else "key 'train.epochs' must be int, got string") and lie in its declared
// range. Ints are accepted where a float is expected. Tables declared open
// (e.g. a plugin's own table, checked by the plugin's key list) are skipped.
//
// Defaults live in the schema, once: validate() keeps the schema, and a getter
// called without a fallback returns the declared default of an absent key. A
// Config never validated falls back to the core's own keys ([job],
// [communicator], [strategy], [ps]). A key with no value and no declared
// default is an InvalidUsage naming it (a read site's typo, not the user's).
enum class ConfigType { String, Int, Float, Bool, StringList, IntList, Table, FloatList };
const char* to_string(ConfigType t);

struct ConfigKey {
  std::string path;  // dotted: "communicator.timeout_s"
  ConfigType type;
  std::string default_text;  // TOML literal, "" if the key has no default
  std::string description;
  std::optional<double> min, max;  // inclusive bounds of an Int or Float key
};

class ConfigSchema {
 public:
  // Declares a key once: a second declaration of the same path, or a default
  // that is not a literal of the key's type, throws InvalidUsage (so an app
  // cannot restate a key the trainer or the core declares with another default).
  ConfigSchema& add(std::string path, ConfigType type, std::string default_text = "", std::string description = "");
  // Bounds of the key added last (validate() checks values; the default must lie inside).
  ConfigSchema& at_least(double min);
  ConfigSchema& in_range(double min, double max);
  // Declares a table whose contents validate() does not check (validated elsewhere).
  ConfigSchema& add_open_table(std::string path);
  const std::vector<ConfigKey>& keys() const { return keys_; }
  const std::vector<std::string>& open_tables() const { return open_tables_; }
  const ConfigKey* find(const std::string& path) const;

 private:
  std::vector<ConfigKey> keys_;
  std::vector<std::string> open_tables_;
};

// Where a key was defined, for messages.
struct ConfigLocation {
  std::string file;
  int line = 0;
  int column = 0;
  std::string str() const;  // "file:line:col" (or "file" when line is 0)
};

class Config {
 public:
  Config();  // empty document
  ~Config();
  Config(const Config&);
  Config& operator=(const Config&);
  Config(Config&&) noexcept;
  Config& operator=(Config&&) noexcept;

  static Config from_file(const std::string& path, const std::vector<std::string>& overrides = {});
  static Config from_string(const std::string& text, const std::string& source_name,
                            const std::vector<std::string>& overrides = {});

  // Applies one "a.b.c=value" override (see above).
  void apply_override(const std::string& assignment);
  void validate(const ConfigSchema& schema) const;

  bool has(const std::string& path) const;
  // Typed getters. Without a fallback, a missing key gives its declared
  // default (see above); with one, the fallback (for keys no schema declares,
  // such as a user's own). A present key of the wrong type throws ConfigError
  // naming the expected type.
  std::string get_string(const std::string& path) const;
  int64_t get_int(const std::string& path) const;
  double get_float(const std::string& path) const;
  bool get_bool(const std::string& path) const;
  std::string get_string(const std::string& path, const std::string& fallback) const;
  int64_t get_int(const std::string& path, int64_t fallback) const;
  double get_float(const std::string& path, double fallback) const;
  bool get_bool(const std::string& path, bool fallback) const;
  // Lists: a missing key gives its declared default, else an empty list.
  std::vector<std::string> get_string_list(const std::string& path) const;
  std::vector<int64_t> get_int_list(const std::string& path) const;
  // Floats and integers alike, as doubles.
  std::vector<double> get_float_list(const std::string& path) const;
  // The schema validate() kept (null before).
  const ConfigSchema* schema() const;
  // Sets a value from a TOML literal (as an override, but without the parse
  // fallback to string).
  void set_literal(const std::string& path, const std::string& toml_literal);

  // The table at path flattened into "key = literal" lines, keys relative to
  // the table and dotted for nested tables; "" if the table is absent.
  std::string table_as_flat_toml(const std::string& path) const;
  // Keys directly under a table (or the root for ""), in document order.
  std::vector<std::string> keys_of(const std::string& path) const;
  ConfigLocation location_of(const std::string& path) const;
  const std::string& source() const;
  // The whole document as TOML text.
  std::string dump() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Levenshtein-closest candidate, or "" if none is close enough to suggest.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace dtrain
