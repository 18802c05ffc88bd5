// TableConfig from [ps.tables.<name>], the [ps] keys, and the enum names.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/ps.h"
#include "ps/ps_internal.h"
#include "ps/table_desc.h"

namespace dtrain::ps {

void add_ps_keys(ConfigSchema& schema) {
  schema.add("ps.backend", ConfigType::String, "\"ps_grpc\"", "the parameter-server plugin")
      .add("ps.collective", ConfigType::String, "\"gloo\"",
           "backend of the workers' side communicator (barriers, metric all-reduces); \"\" = none")
      .add("ps.timeout_s", ConfigType::Float, "60", "default deadline of every parameter-server op")
      .add("ps.checkpoint_dir", ConfigType::String, "\"\"", "where PsWorker::save_checkpoint writes the tables")
      .add("ps.save_on_exit", ConfigType::Bool, "false", "worker 0 saves every table when the workers finish")
      .add_open_table("ps.tables");
}

namespace {

using sdk::ps_fields::Key;

// The [ps.tables.<name>] keys, from the list.
const std::vector<std::string> kTableKeys = {
#define DTRAIN_PS_KEY_NAME(field, ...) #field,
    DTRAIN_PS_TABLE_KEYS(DTRAIN_PS_KEY_NAME)
#undef DTRAIN_PS_KEY_NAME
};

// The TOML names of an enum field's values: the conversion hook of the
// fields whose C type is an enum (kind, optimizer, initializer).
template <class E>
using Names = std::vector<std::pair<const char*, E>>;
const Names<TableKind>& names_of(TableKind) {
  static const Names<TableKind> n = {{"sparse", TableKind::Sparse}, {"dense", TableKind::Dense}};
  return n;
}
const Names<Optimizer>& names_of(Optimizer) {
  static const Names<Optimizer> n = {
      {"sgd", Optimizer::Sgd}, {"adagrad", Optimizer::Adagrad}, {"adam", Optimizer::Adam}};
  return n;
}
const Names<Initializer>& names_of(Initializer) {
  static const Names<Initializer> n = {
      {"constant", Initializer::Constant}, {"uniform", Initializer::Uniform}, {"normal", Initializer::Normal}};
  return n;
}
const Names<Mode>& names_of(Mode) {
  static const Names<Mode> n = {{"sync", Mode::Sync}, {"async", Mode::Async}, {"geo", Mode::Geo}};
  return n;
}

template <class E>
const char* name_of(E value) {
  for (const auto& [name, v] : names_of(value))
    if (v == value) return name;
  return "?";
}

class TableReader {
 public:
  TableReader(const Config& c, std::string table) : c_(c), table_(std::move(table)) {}

  std::string path(const std::string& key) const { return table_ + "." + key; }
  bool has(const std::string& key) const { return c_.has(path(key)); }

  [[noreturn]] void fail(const std::string& key, const std::string& message) const {
    ConfigLocation loc = c_.location_of(path(key));
    if (loc.line == 0) loc = c_.location_of(table_);
    throw ConfigError(loc.file.empty() ? c_.source() : loc.file, loc.line, loc.column, path(key), message);
  }

  // Sets v from the key if the table has it; an absent key leaves v (its
  // listed default) as it is. The key's C type decides how it is read.
  template <class T>
  void read(const std::string& key, T& v) const {
    if (!has(key)) return;
    if constexpr (std::is_enum_v<T>) {
      v = choice(key, names_of(T{}));
    } else if constexpr (std::is_floating_point_v<T>) {
      v = c_.get_float(path(key));
      if (!std::isfinite(v)) fail(key, "must be a finite number");
    } else {
      static_assert(std::is_unsigned_v<T>, "a listed integer key is unsigned");
      const uint64_t max = std::min<uint64_t>(std::numeric_limits<T>::max(), INT64_MAX);
      v = static_cast<T>(integer(key, 0, max));
    }
  }

  uint64_t integer(const std::string& key, uint64_t min, uint64_t max) const {
    int64_t v = c_.get_int(path(key));
    if (v < 0 || static_cast<uint64_t>(v) < min || static_cast<uint64_t>(v) > max)
      fail(key, "must be in " + std::to_string(min) + ".." + std::to_string(max) + ", got " + std::to_string(v));
    return static_cast<uint64_t>(v);
  }

 private:
  template <typename T>
  T choice(const std::string& key, const Names<T>& names) const {
    std::string v = c_.get_string(path(key));
    std::string known;
    for (auto& [n, value] : names) {
      if (v == n) return value;
      known += std::string(known.empty() ? "" : ", ") + "\"" + n + "\"";
    }
    fail(key, "unknown " + key + " \"" + v + "\"; use one of " + known);
  }

  const Config& c_;
  std::string table_;
};

constexpr uint64_t kMaxDim = uint64_t{1} << 40;

}  // namespace

const char* to_string(Mode m) { return name_of(m); }
const char* to_string(Optimizer o) { return name_of(o); }

TableConfig::TableConfig() {
#define DTRAIN_PS_DEFAULT(field, type, def, ...) field = static_cast<decltype(field)>(def);
  DTRAIN_PS_TABLE_KEYS(DTRAIN_PS_DEFAULT)
#undef DTRAIN_PS_DEFAULT
}

TableConfig TableConfig::from_config(const Config& c, const std::string& name) {
  if (!valid_table_name(name) || name.find('.') != std::string::npos)
    throw InvalidUsage("table name '" + name +
                       "' must be letters, digits, '_' or '-' (it names files and a TOML table)");
  std::string table = "ps.tables." + name;
  if (!c.has(table)) {
    std::string known;
    if (c.has("ps.tables"))
      for (auto& k : c.keys_of("ps.tables")) known += (known.empty() ? "" : ", ") + k;
    ConfigLocation loc = c.location_of("ps.tables");
    throw ConfigError(
        loc.file.empty() ? c.source() : loc.file, loc.line, loc.column, table,
        "the job file has no [" + table + "] table" + (known.empty() ? std::string() : " (tables: " + known + ")"));
  }
  TableReader r(c, table);
  for (const std::string& key : c.keys_of(table)) {
    if (std::find(kTableKeys.begin(), kTableKeys.end(), key) != kTableKeys.end()) continue;
    std::string message = "unknown key '" + table + "." + key + "'";
    std::string suggestion = closest_match(key, kTableKeys);
    if (!suggestion.empty()) message += "; did you mean '" + table + "." + suggestion + "'?";
    r.fail(key, message);
  }

  // Every listed key: required ones present, each read as its type, the
  // default (TableConfig()) where absent.
  TableConfig t;
  t.name = name;
#define DTRAIN_PS_READ(field, type, def, key, offset, doc)                                  \
  if (Key::key == Key::Required && !r.has(#field)) r.fail(#field, "is required (" doc ")"); \
  r.read(#field, t.field);
  DTRAIN_PS_TABLE_KEYS(DTRAIN_PS_READ)
#undef DTRAIN_PS_READ
  if (t.kind == TableKind::Dense) {
#define DTRAIN_PS_SPARSE_ONLY(field, type, def, key, ...) \
  if (Key::key == Key::SparseOnly && r.has(#field))       \
    r.fail(#field, "applies to sparse tables only; this table is kind = \"dense\"");
    DTRAIN_PS_TABLE_KEYS(DTRAIN_PS_SPARSE_ONLY)
#undef DTRAIN_PS_SPARSE_ONLY
  }

  // The values' ranges (their defaults are in range).
  if (t.dim < 1 || t.dim > kMaxDim)
    r.fail("dim", "must be in 1.." + std::to_string(kMaxDim) + ", got " + std::to_string(t.dim));
  if (!(t.learning_rate > 0)) r.fail("learning_rate", "must be > 0");
  if (t.beta1 < 0 || t.beta1 >= 1) r.fail("beta1", "must be in [0, 1)");
  if (t.beta2 < 0 || t.beta2 >= 1) r.fail("beta2", "must be in [0, 1)");
  if (!(t.epsilon > 0)) r.fail("epsilon", "must be > 0");
  if (t.initial_g2sum < 0) r.fail("initial_g2sum", "must be >= 0");
  if (t.initializer == Initializer::Uniform && !(t.init_b > t.init_a))
    r.fail(r.has("init_b") ? "init_b" : "initializer",
           "a uniform initializer needs init_b > init_a (the range [init_a, init_b)), got [" +
               std::to_string(t.init_a) + ", " + std::to_string(t.init_b) + ")");
  if (t.initializer == Initializer::Normal && t.init_b < 0)
    r.fail("init_b", "is the normal initializer's standard deviation and must be >= 0");
  if (t.admit_probability < 0 || t.admit_probability > 1) r.fail("admit_probability", "must be in [0, 1]");
  if (t.decay_rate < 0 || t.decay_rate > 1) r.fail("decay_rate", "must be in [0, 1]");
  return t;
}

bool valid_table_name(const std::string& name) {
  if (name.empty() || name.size() > 200) return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' ||
           ch == '-';
  });
}

}  // namespace dtrain::ps
