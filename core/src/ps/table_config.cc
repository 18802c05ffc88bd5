// TableConfig from [ps.tables.<name>], the [ps] keys, and the enum names.
#include <algorithm>
#include <cmath>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/ps.h"
#include "ps/ps_internal.h"

namespace dtrain::ps {

const char* to_string(Mode m) {
  switch (m) {
    case Mode::Sync: return "sync";
    case Mode::Async: return "async";
    case Mode::Geo: return "geo";
  }
  return "?";
}

const char* to_string(Optimizer o) {
  switch (o) {
    case Optimizer::Sgd: return "sgd";
    case Optimizer::Adagrad: return "adagrad";
    case Optimizer::Adam: return "adam";
  }
  return "?";
}

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

const std::vector<std::string> kTableKeys = {"kind",
                                             "dim",
                                             "optimizer",
                                             "learning_rate",
                                             "beta1",
                                             "beta2",
                                             "epsilon",
                                             "initial_g2sum",
                                             "initializer",
                                             "init_a",
                                             "init_b",
                                             "seed",
                                             "admit_count",
                                             "admit_probability",
                                             "decay_rate",
                                             "nonclk_coeff",
                                             "click_coeff",
                                             "delete_threshold",
                                             "delete_after_unseen_days"};

class TableReader {
 public:
  TableReader(const Config& c, std::string table) : c_(c), table_(std::move(table)) {}

  std::string path(const std::string& key) const { return table_ + "." + key; }

  [[noreturn]] void fail(const std::string& key, const std::string& message) const {
    ConfigLocation loc = c_.location_of(path(key));
    if (loc.line == 0) loc = c_.location_of(table_);
    throw ConfigError(loc.file.empty() ? c_.source() : loc.file, loc.line, loc.column, path(key), message);
  }

  template <typename T>
  T choice(const std::string& key, T fallback, const std::vector<std::pair<const char*, T>>& names) const {
    if (!c_.has(path(key))) return fallback;
    std::string v = c_.get_string(path(key));
    std::string known;
    for (auto& [n, value] : names) {
      if (v == n) return value;
      known += std::string(known.empty() ? "" : ", ") + "\"" + n + "\"";
    }
    fail(key, "unknown " + key + " \"" + v + "\"; use one of " + known);
  }

  double number(const std::string& key, double fallback) const {
    double v = c_.get_float(path(key), fallback);
    if (!std::isfinite(v)) fail(key, "must be a finite number");
    return v;
  }

  int64_t integer(const std::string& key, int64_t fallback, int64_t min, int64_t max) const {
    int64_t v = c_.get_int(path(key), fallback);
    if (v < min || v > max)
      fail(key, "must be in " + std::to_string(min) + ".." + std::to_string(max) + ", got " + std::to_string(v));
    return v;
  }

 private:
  const Config& c_;
  std::string table_;
};

}  // namespace

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

  TableConfig t;
  t.name = name;
  t.kind = r.choice<TableKind>("kind", TableKind::Sparse, {{"sparse", TableKind::Sparse}, {"dense", TableKind::Dense}});
  if (!c.has(r.path("dim"))) r.fail("dim", "is required (values per row for a sparse table, length for a dense one)");
  t.dim = static_cast<uint64_t>(r.integer("dim", 0, 1, int64_t(1) << 40));
  t.optimizer =
      r.choice<Optimizer>("optimizer", Optimizer::Sgd,
                          {{"sgd", Optimizer::Sgd}, {"adagrad", Optimizer::Adagrad}, {"adam", Optimizer::Adam}});
  t.learning_rate = r.number("learning_rate", t.learning_rate);
  if (!(t.learning_rate > 0)) r.fail("learning_rate", "must be > 0");
  t.beta1 = r.number("beta1", t.beta1);
  if (t.beta1 < 0 || t.beta1 >= 1) r.fail("beta1", "must be in [0, 1)");
  t.beta2 = r.number("beta2", t.beta2);
  if (t.beta2 < 0 || t.beta2 >= 1) r.fail("beta2", "must be in [0, 1)");
  t.epsilon = r.number("epsilon", t.epsilon);
  if (!(t.epsilon > 0)) r.fail("epsilon", "must be > 0");
  t.initial_g2sum = r.number("initial_g2sum", t.initial_g2sum);
  if (t.initial_g2sum < 0) r.fail("initial_g2sum", "must be >= 0");
  t.initializer = r.choice<Initializer>(
      "initializer", Initializer::Constant,
      {{"constant", Initializer::Constant}, {"uniform", Initializer::Uniform}, {"normal", Initializer::Normal}});
  t.init_a = r.number("init_a", t.init_a);
  t.init_b = r.number("init_b", t.init_b);
  if (t.initializer == Initializer::Uniform && !(t.init_b > t.init_a))
    r.fail(c.has(r.path("init_b")) ? "init_b" : "initializer",
           "a uniform initializer needs init_b > init_a (the range [init_a, init_b)), got [" +
               std::to_string(t.init_a) + ", " + std::to_string(t.init_b) + ")");
  if (t.initializer == Initializer::Normal && t.init_b < 0)
    r.fail("init_b", "is the normal initializer's standard deviation and must be >= 0");
  t.seed = static_cast<uint64_t>(r.integer("seed", 0, 0, INT64_MAX));
  t.admit_count = static_cast<uint32_t>(r.integer("admit_count", 0, 0, UINT32_MAX));
  t.admit_probability = r.number("admit_probability", t.admit_probability);
  if (t.admit_probability < 0 || t.admit_probability > 1) r.fail("admit_probability", "must be in [0, 1]");
  t.decay_rate = r.number("decay_rate", t.decay_rate);
  if (t.decay_rate < 0 || t.decay_rate > 1) r.fail("decay_rate", "must be in [0, 1]");
  t.nonclk_coeff = r.number("nonclk_coeff", t.nonclk_coeff);
  t.click_coeff = r.number("click_coeff", t.click_coeff);
  t.delete_threshold = r.number("delete_threshold", t.delete_threshold);
  t.delete_after_unseen_days = static_cast<uint32_t>(r.integer("delete_after_unseen_days", 0, 0, UINT32_MAX));
  if (t.kind == TableKind::Dense)
    for (const char* key : {"admit_count", "admit_probability", "decay_rate", "nonclk_coeff", "click_coeff",
                            "delete_threshold", "delete_after_unseen_days"})
      if (c.has(r.path(key))) r.fail(key, "applies to sparse tables only; this table is kind = \"dense\"");
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
