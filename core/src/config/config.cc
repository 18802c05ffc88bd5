#include "dtrain/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <toml++/toml.h>

#include "config/toml_text.h"
#include "dtrain/error.h"
#include "dtrain/job.h"
#include "dtrain/ps.h"
#include "dtrain/sdk/strings.h"
#include "dtrain/strategy.h"

namespace dtrain {

using namespace config_text;

namespace {

constexpr uint64_t kOverrideOrderBase = uint64_t{1} << 62;

using sdk::trim;

// "a.b.c" -> {"a","b","c"}; empty pieces are kept ("a..b" is an error later).
std::vector<std::string> split_path(const std::string& path) {
  if (path.empty()) return {};
  return sdk::split(path, '.', /*skip_empty=*/false);
}

std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string parent_of(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::string leaf_of(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

}  // namespace

const char* to_string(ConfigType t) {
  switch (t) {
    case ConfigType::String: return "string";
    case ConfigType::Int: return "int";
    case ConfigType::Float: return "float";
    case ConfigType::Bool: return "bool";
    case ConfigType::StringList: return "array of strings";
    case ConfigType::IntList: return "array of ints";
    case ConfigType::FloatList: return "array of numbers";
    case ConfigType::Table: return "table";
  }
  return "unknown";
}

namespace {

bool outside(const ConfigKey& k, double v) { return (k.min && v < *k.min) || (k.max && v > *k.max); }

std::string range_text(const ConfigKey& k) {
  if (k.min && k.max) return "in [" + literal_number(*k.min) + ", " + literal_number(*k.max) + "]";
  if (k.min) return ">= " + literal_number(*k.min);
  return "<= " + literal_number(*k.max);
}
}  // namespace

ConfigSchema& ConfigSchema::add(std::string path, ConfigType type, std::string default_text, std::string description) {
  if (find(path)) throw InvalidUsage("config key '" + path + "' is declared twice (a key has one declaration)");
  if (!default_text.empty()) {
    auto parsed = parse_literal(default_text);
    if (!parsed || !matches(type, *parsed->get("v")))
      throw InvalidUsage("config key '" + path + "': default " + default_text + " is not a " + to_string(type));
  }
  keys_.push_back(ConfigKey{std::move(path), type, std::move(default_text), std::move(description), {}, {}});
  return *this;
}

ConfigSchema& ConfigSchema::at_least(double min) {
  if (keys_.empty()) throw InvalidUsage("ConfigSchema::at_least before any key");
  return in_range(min, HUGE_VAL);
}

ConfigSchema& ConfigSchema::in_range(double min, double max) {
  if (keys_.empty()) throw InvalidUsage("ConfigSchema::in_range before any key");
  ConfigKey& k = keys_.back();
  if (k.type != ConfigType::Int && k.type != ConfigType::Float)
    throw InvalidUsage("config key '" + k.path + "' has a range but is a " + to_string(k.type));
  k.min = min;
  if (max != HUGE_VAL) k.max = max;
  if (!k.default_text.empty()) {
    double d = number_of(*parse_literal(k.default_text)->get("v"));
    if (outside(k, d))
      throw InvalidUsage("config key '" + k.path + "': default " + k.default_text + " is not " + range_text(k));
  }
  return *this;
}

ConfigSchema& ConfigSchema::add_open_table(std::string path) {
  open_tables_.push_back(std::move(path));
  return *this;
}

const ConfigKey* ConfigSchema::find(const std::string& path) const {
  for (const ConfigKey& k : keys_)
    if (k.path == path) return &k;
  return nullptr;
}

std::string ConfigLocation::str() const {
  if (line <= 0) return file;
  std::string s = file + ":" + std::to_string(line);
  if (column > 0) s += ":" + std::to_string(column);
  return s;
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const std::string& c : candidates) {
    size_t d = sdk::levenshtein(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  size_t limit = std::max<size_t>(2, word.size() / 3);
  return best_distance <= limit ? best : "";
}

namespace {
// The core's own keys, the defaults of a Config that was never validated.
const ConfigSchema& core_schema() {
  static const ConfigSchema schema = [] {
    ConfigSchema s;
    add_job_keys(s);
    add_strategy_keys(s);
    ps::add_ps_keys(s);
    return s;
  }();
  return schema;
}
}  // namespace

struct Config::Impl {
  struct Entry {
    ConfigLocation value;  // where the value starts
    ConfigLocation key;    // where the key is written
    uint64_t order = 0;    // document order among siblings
  };

  toml::table doc;
  std::string source;
  std::map<std::string, Entry> locations;
  uint64_t next_order = kOverrideOrderBase;
  mutable std::shared_ptr<const ConfigSchema> schema;  // set by validate()

  // The declaration of a key: the validated schema's, else the core's own.
  const ConfigKey* declared(const std::string& path) const {
    if (schema)
      if (const ConfigKey* k = schema->find(path)) return k;
    return core_schema().find(path);
  }

  // The value of path, else its declared default (parsed into holder); an
  // undeclared absent key, or one declared without a default, is a read site's bug.
  const toml::node& value_or_default(const std::string& path, std::optional<toml::table>& holder) const {
    if (const toml::node* node = find(path)) return *node;
    const ConfigKey* k = declared(path);
    if (!k) throw InvalidUsage("config key '" + path + "' has no value and is declared by no schema");
    if (k->default_text.empty()) throw InvalidUsage("config key '" + path + "' has no value and no default");
    holder = parse_literal(k->default_text);
    return *holder->get("v");
  }

  // The array at path, else its declared default, else none.
  const toml::array* list_or_default(const toml::node* node, const std::string& path,
                                     std::optional<toml::table>& holder) const {
    if (!node) {
      const ConfigKey* k = declared(path);
      if (!k || k->default_text.empty()) return nullptr;
      holder = parse_literal(k->default_text);
      node = holder->get("v");
    }
    return node->as_array();
  }

  // The list at path (else its declared default) of `type`, each element through `convert`.
  template <typename T, typename Convert>
  std::vector<T> list(const std::string& path, ConfigType type, Convert convert) const {
    std::vector<T> out;
    std::optional<toml::table> holder;
    const toml::node* node = find(path);
    if (node && !matches(type, *node)) type_error(path, *node, to_string(type));
    if (const toml::array* a = list_or_default(node, path, holder))
      for (const toml::node& e : *a) out.push_back(convert(e));
    return out;
  }

  void index_parsed(const toml::table& table, const std::string& prefix) {
    for (auto&& [k, v] : table) {
      std::string path = join_path(prefix, std::string(k.str()));
      Entry e;
      const toml::source_region& ks = k.source();
      const toml::source_region& vs = v.source();
      e.key = {source, static_cast<int>(ks.begin.line), static_cast<int>(ks.begin.column)};
      e.value = {source, static_cast<int>(vs.begin.line), static_cast<int>(vs.begin.column)};
      if (e.key.line == 0) e.key = e.value;
      if (e.value.line == 0) e.value = e.key;
      e.order = static_cast<uint64_t>(e.key.line) * 1000000u + static_cast<uint64_t>(e.key.column);
      locations[path] = e;
      if (const toml::table* sub = v.as_table()) index_parsed(*sub, path);
    }
  }

  void index_synthetic(const toml::node& node, const std::string& path, const std::string& file) {
    Entry e;
    e.key = e.value = ConfigLocation{file, 0, 0};
    e.order = next_order++;
    locations[path] = e;
    if (const toml::table* sub = node.as_table())
      for (auto&& [k, v] : *sub) index_synthetic(v, join_path(path, std::string(k.str())), file);
  }

  void forget(const std::string& path) {
    auto it = locations.lower_bound(path);
    while (it != locations.end() && (it->first == path || it->first.compare(0, path.size() + 1, path + ".") == 0))
      it = locations.erase(it);
  }

  ConfigLocation value_location(const std::string& path) const {
    auto it = locations.find(path);
    return it != locations.end() ? it->second.value : ConfigLocation{source, 0, 0};
  }

  ConfigLocation key_location(const std::string& path) const {
    auto it = locations.find(path);
    return it != locations.end() ? it->second.key : ConfigLocation{source, 0, 0};
  }

  const toml::node* find(const std::string& path) const {
    if (path.empty()) return &doc;
    const toml::node* node = &doc;
    for (const std::string& part : split_path(path)) {
      const toml::table* t = node->as_table();
      if (!t) return nullptr;
      node = t->get(part);
      if (!node) return nullptr;
    }
    return node;
  }

  std::vector<std::pair<std::string, const toml::node*>> ordered(const toml::table& table,
                                                                 const std::string& prefix) const {
    std::vector<std::tuple<uint64_t, std::string, const toml::node*>> items;
    for (auto&& [k, v] : table) {
      std::string key(k.str());
      auto it = locations.find(join_path(prefix, key));
      uint64_t order = it != locations.end() ? it->second.order : ~uint64_t{0};
      items.emplace_back(order, key, &v);
    }
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
    std::vector<std::pair<std::string, const toml::node*>> out;
    for (auto& [order, key, node] : items) out.emplace_back(key, node);
    return out;
  }

  [[noreturn]] void type_error(const std::string& path, const toml::node& node, const std::string& expected) const {
    ConfigLocation loc = value_location(path);
    throw ConfigError(loc.file, loc.line, loc.column, path, "must be " + expected + ", got " + describe_value(node));
  }

  const toml::table* table_at(const std::string& path) const {
    const toml::node* node = find(path);
    if (!node) return nullptr;
    if (!node->is_table()) type_error(path, *node, "table");
    return node->as_table();
  }

  void flatten(const toml::table& table, const std::string& table_path, const std::string& rel,
               std::string& out) const {
    for (auto& [key, node] : ordered(table, table_path)) {
      std::string rel_key = rel.empty() ? format_key(key) : rel + "." + format_key(key);
      const toml::table* sub = node->as_table();
      if (sub && !sub->empty())
        flatten(*sub, join_path(table_path, key), rel_key, out);
      else
        out += rel_key + " = " + literal(*node) + "\n";
    }
  }

  // Puts node at the key path given as components, creating tables on the way.
  void set_node(const std::vector<std::string>& parts, toml::node&& node, const std::string& error_file,
                const std::string& location_file) {
    toml::table* table = &doc;
    std::string path;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      path = join_path(path, parts[i]);
      toml::node* existing = table->get(parts[i]);
      if (!existing) {
        table->insert_or_assign(parts[i], toml::table{});
        existing = table->get(parts[i]);
        index_synthetic(*existing, path, location_file);
      } else if (!existing->is_table()) {
        throw ConfigError(error_file, 0, 0, path,
                          std::string("is ") + describe_value(*existing) + ", not a table, so '" +
                              join_path(path, parts.back()) + "' cannot be set");
      }
      table = existing->as_table();
    }
    std::string full = join_path(path, parts.back());
    if (const toml::node* existing = table->get(parts.back()); existing && existing->is_table() && !node.is_table()) {
      throw ConfigError(error_file, 0, 0, full,
                        "is a table and cannot be replaced by " + describe_value(node) + "; set its keys instead ('" +
                            full + ".KEY=value')");
    }
    table->insert_or_assign(parts.back(), std::move(node));
    forget(full);
    index_synthetic(*table->get(parts.back()), full, location_file);
  }
};

namespace {}  // namespace

Config::Config() : impl_(std::make_unique<Impl>()) {}
Config::~Config() = default;
Config::Config(const Config& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
Config& Config::operator=(const Config& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
Config::Config(Config&& other) noexcept = default;
Config& Config::operator=(Config&& other) noexcept = default;

Config Config::from_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ConfigError(path, 0, 0, "", "cannot read the configuration file: it does not exist");
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(path, 0, 0, "", "cannot read the configuration file: it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(path, 0, 0, "", std::string("cannot read the configuration file: ") + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(path, 0, 0, "", "cannot read the configuration file: read failed");
  return from_string(text.str(), path, overrides);
}

Config Config::from_string(const std::string& text, const std::string& source_name,
                           const std::vector<std::string>& overrides) {
  Config config;
  config.impl_->source = source_name;
  try {
    config.impl_->doc = toml::parse(std::string_view(text), std::string_view(source_name));
  } catch (const toml::parse_error& e) {
    throw ConfigError(source_name, static_cast<int>(e.source().begin.line), static_cast<int>(e.source().begin.column),
                      "", std::string(e.description()));
  }
  config.impl_->index_parsed(config.impl_->doc, "");
  for (const std::string& o : overrides) config.apply_override(o);
  return config;
}

void Config::apply_override(const std::string& assignment) {
  const std::string file = "-o " + assignment;
  size_t eq = assignment.find('=');
  if (eq == std::string::npos)
    throw ConfigError(file, 0, 0, "", "an override must look like key=value (e.g. -o train.epochs=3)");
  std::string key_text = trim(assignment.substr(0, eq));
  std::string value_text = trim(assignment.substr(eq + 1));
  auto parts = parse_key(key_text);
  if (!parts) throw ConfigError(file, 0, 0, "", "'" + key_text + "' is not a valid TOML key");
  if (auto parsed = parse_literal(value_text)) {
    impl_->set_node(*parts, std::move(*parsed->get("v")), file, file);
  } else {
    impl_->set_node(*parts, toml::value<std::string>(value_text), file, file);
  }
}

void Config::set_literal(const std::string& path, const std::string& toml_literal) {
  const std::string file = "set " + path + "=" + toml_literal;
  std::vector<std::string> parts = split_path(path);
  if (parts.empty() || std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); }))
    throw InvalidUsage("Config::set_literal: '" + path + "' is not a dotted key path");
  auto parsed = parse_literal(toml_literal);
  if (!parsed) throw ConfigError(file, 0, 0, path, "'" + toml_literal + "' is not a TOML value");
  impl_->set_node(parts, std::move(*parsed->get("v")), file, file);
}

void Config::validate(const ConfigSchema& schema) const {
  std::set<std::string> open(schema.open_tables().begin(), schema.open_tables().end());
  std::set<std::string> prefixes;
  std::vector<std::string> known;
  auto add_prefixes = [&](const std::string& path) {
    for (std::string p = parent_of(path); !p.empty(); p = parent_of(p)) prefixes.insert(p);
  };
  for (const ConfigKey& k : schema.keys()) {
    known.push_back(k.path);
    add_prefixes(k.path);
  }
  for (const std::string& t : schema.open_tables()) {
    known.push_back(t);
    add_prefixes(t);
  }
  for (const std::string& p : prefixes) known.push_back(p);

  auto suggest = [&](const std::string& path) -> std::string {
    std::string parent = parent_of(path), leaf = leaf_of(path);
    std::vector<std::string> siblings;
    for (const std::string& k : known)
      if (parent_of(k) == parent) siblings.push_back(leaf_of(k));
    std::string s = closest_match(leaf, siblings);
    if (!s.empty()) return join_path(parent, s);
    s = closest_match(path, known);
    if (!s.empty()) return s;
    for (const std::string& k : known)
      if (leaf_of(k) == leaf) return k;  // right key, wrong table
    return "";
  };

  std::function<void(const toml::table&, const std::string&)> walk = [&](const toml::table& table,
                                                                         const std::string& prefix) {
    for (auto& [key, node] : impl_->ordered(table, prefix)) {
      std::string path = join_path(prefix, key);
      if (open.count(path)) {
        if (!node->is_table()) impl_->type_error(path, *node, "table");
        continue;
      }
      if (const ConfigKey* k = schema.find(path)) {
        if (!matches(k->type, *node)) impl_->type_error(path, *node, to_string(k->type));
        if ((k->min || k->max) && outside(*k, number_of(*node))) {
          ConfigLocation loc = impl_->value_location(path);
          throw ConfigError(loc.file, loc.line, loc.column, path,
                            "must be " + range_text(*k) + ", got " + literal(*node));
        }
        if (k->type == ConfigType::Table && prefixes.count(path)) walk(*node->as_table(), path);
        continue;
      }
      if (node->is_table() && prefixes.count(path)) {
        walk(*node->as_table(), path);
        continue;
      }
      ConfigLocation loc = impl_->key_location(path);
      std::string message = "unknown key '" + path + "'";
      std::string suggestion = suggest(path);
      if (!suggestion.empty()) message += "; did you mean '" + suggestion + "'?";
      throw ConfigError(loc.file, loc.line, loc.column, "", message);
    }
  };
  walk(impl_->doc, "");
  impl_->schema = std::make_shared<const ConfigSchema>(schema);
}

const ConfigSchema* Config::schema() const { return impl_->schema.get(); }

bool Config::has(const std::string& path) const { return impl_->find(path) != nullptr; }

std::string Config::get_string(const std::string& path) const {
  std::optional<toml::table> d;
  const toml::node& node = impl_->value_or_default(path, d);
  if (!node.is_string()) impl_->type_error(path, node, "string");
  return node.as_string()->get();
}

int64_t Config::get_int(const std::string& path) const {
  std::optional<toml::table> d;
  const toml::node& node = impl_->value_or_default(path, d);
  if (!node.is_integer()) impl_->type_error(path, node, "int");
  return node.as_integer()->get();
}

double Config::get_float(const std::string& path) const {
  std::optional<toml::table> d;
  const toml::node& node = impl_->value_or_default(path, d);
  if (!node.is_integer() && !node.is_floating_point()) impl_->type_error(path, node, "float");
  return number_of(node);
}

bool Config::get_bool(const std::string& path) const {
  std::optional<toml::table> d;
  const toml::node& node = impl_->value_or_default(path, d);
  if (!node.is_boolean()) impl_->type_error(path, node, "bool");
  return node.as_boolean()->get();
}

std::string Config::get_string(const std::string& path, const std::string& fallback) const {
  return has(path) ? get_string(path) : fallback;
}

int64_t Config::get_int(const std::string& path, int64_t fallback) const {
  return has(path) ? get_int(path) : fallback;
}

double Config::get_float(const std::string& path, double fallback) const {
  return has(path) ? get_float(path) : fallback;
}

bool Config::get_bool(const std::string& path, bool fallback) const { return has(path) ? get_bool(path) : fallback; }

std::vector<std::string> Config::get_string_list(const std::string& path) const {
  return impl_->list<std::string>(path, ConfigType::StringList,
                                  [](const toml::node& e) { return e.as_string()->get(); });
}

std::vector<int64_t> Config::get_int_list(const std::string& path) const {
  return impl_->list<int64_t>(path, ConfigType::IntList, [](const toml::node& e) { return e.as_integer()->get(); });
}

std::vector<double> Config::get_float_list(const std::string& path) const {
  return impl_->list<double>(path, ConfigType::FloatList, [](const toml::node& e) { return number_of(e); });
}

std::string Config::table_as_flat_toml(const std::string& path) const {
  const toml::table* table = impl_->table_at(path);
  if (!table) return "";
  std::string out;
  impl_->flatten(*table, path, "", out);
  return out;
}

std::vector<std::string> Config::keys_of(const std::string& path) const {
  std::vector<std::string> out;
  const toml::table* table = impl_->table_at(path);
  if (!table) return out;
  for (auto& [key, node] : impl_->ordered(*table, path)) out.push_back(key);
  return out;
}

ConfigLocation Config::location_of(const std::string& path) const { return impl_->value_location(path); }

const std::string& Config::source() const { return impl_->source; }

std::string Config::dump() const {
  std::ostringstream os;
  constexpr auto flags = toml::toml_formatter::default_flags &
                         ~(toml::format_flags::indentation | toml::format_flags::allow_literal_strings);
  os << toml::toml_formatter(impl_->doc, flags);
  std::string s = os.str();
  if (!s.empty() && s.back() != '\n') s += '\n';
  return s;
}

}  // namespace dtrain
