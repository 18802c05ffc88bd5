#include "dtrain/role_maker.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <iterator>
#include <sstream>

#include "dtrain/config.h"
#include "dtrain/error.h"
#include "dtrain/sdk/strings.h"
#include "roles/role_fields.h"

extern char** environ;

namespace dtrain {

namespace {

using roles::Namer;
using sdk::join;

// In order of precedence: dtrain's launcher writes dtrain's, Paddle's and
// torchrun's variables, and its own are complete.
const roles::EnvSource* const kSources[] = {&roles::kDtrainSource, &roles::kPaddleSource, &roles::kTorchrunSource,
                                            &roles::kOmpiSource, &roles::kSlurmSource};

class TomlNamer : public Namer {
 public:
  TomlNamer(const Config& config, std::string table) : config_(config), table_(std::move(table)) {}
  std::string name(const std::string& field) const override { return table_ + "." + field; }
  std::string show(const std::string& field, const std::string& value) const override {
    return name(field) + " = " + value;
  }
  std::string show_list(const std::string& field, const std::vector<std::string>& v) const override {
    std::vector<std::string> quoted;
    for (const std::string& s : v) quoted.push_back("\"" + s + "\"");
    return name(field) + " = [" + join(quoted, ", ") + "]";
  }
  [[noreturn]] void fail(const std::string& field, const std::string& message) const override {
    ConfigLocation loc = config_.location_of(name(field));
    if (loc.line == 0) loc = config_.location_of(table_);
    throw ConfigError(loc.file, loc.line, loc.column, "", message);
  }

 private:
  const Config& config_;
  std::string table_;
};

}  // namespace

const char* to_string(Role r) { return r == Role::Server ? "server" : "worker"; }

std::string RoleInfo::describe() const {
  std::ostringstream os;
  os << to_string(role);
  if (role == Role::Worker) {
    os << " rank " << rank << "/" << world_size;
  } else {
    os << " " << server_index;
    if (!server_endpoints.empty()) os << "/" << server_endpoints.size();
    os << " serving " << world_size << " worker" << (world_size == 1 ? "" : "s");
  }
  os << ", local " << local_rank << "/" << local_world_size << ", node " << node_rank << "/" << nnodes;
  if (!current_endpoint.empty()) os << ", endpoint " << current_endpoint;
  if (!store_endpoint.empty()) os << ", store " << store_endpoint;
  if (!job_id.empty()) os << ", job " << job_id;
  if (restart_count > 0) os << ", restart " << restart_count;
  os << " (" << (source.empty() ? "unknown" : source) << ")";
  return os.str();
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** p = environ; p && *p; ++p) {
    std::string entry = *p;
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

EnvRoleMaker::EnvRoleMaker() : env_(current_environment()) {}
EnvRoleMaker::EnvRoleMaker(std::map<std::string, std::string> env) : env_(std::move(env)) {}

bool EnvRoleMaker::applies() const {
  roles::EnvReader e(env_);
  return std::any_of(std::begin(kSources), std::end(kSources),
                     [&](const roles::EnvSource* s) { return s->applies(e); });
}

RoleInfo EnvRoleMaker::resolve() const {
  roles::EnvReader e(env_);
  for (const roles::EnvSource* s : kSources)
    if (s->applies(e)) return s->resolve(e);
  roles::RawRole r;
  roles::FieldNames names = roles::read_placement(e, env::kDtrain, r);
  r.rank = 0;
  r.world_size = 1;
  return roles::build(r, Role::Worker, roles::EnvNamer(names), "default");
}

TomlRoleMaker::TomlRoleMaker(const Config& config, std::string table)
    : config_(std::make_shared<const Config>(config)), table_(std::move(table)) {}

RoleInfo TomlRoleMaker::resolve() const {
  const Config& c = *config_;
  static const std::vector<std::string> kKeys = {
      "role",      "rank",   "world_size",       "local_rank",       "local_world_size",
      "node_rank", "nnodes", "worker_endpoints", "server_endpoints", "current_endpoint",
      "store",     "job_id"};
  if (!c.has(table_))
    throw ConfigError(c.source(), 0, 0, "", "the [" + table_ + "] table is missing (it says who this process is)");
  for (const std::string& key : c.keys_of(table_)) {
    if (std::find(kKeys.begin(), kKeys.end(), key) != kKeys.end()) continue;
    ConfigLocation loc = c.location_of(table_ + "." + key);
    std::string message = "unknown key '" + table_ + "." + key + "'";
    std::string suggestion = closest_match(key, kKeys);
    if (!suggestion.empty()) message += "; did you mean '" + table_ + "." + suggestion + "'?";
    throw ConfigError(loc.file, loc.line, loc.column, "", message);
  }

  TomlNamer namer(c, table_);
  auto get_int = [&](const std::string& field) -> std::optional<int> {
    std::string path = table_ + "." + field;
    if (!c.has(path)) return std::nullopt;
    int64_t v = c.get_int(path);
    if (v < INT_MIN || v > INT_MAX) namer.fail(field, namer.show(field, std::to_string(v)) + " is out of range");
    return static_cast<int>(v);
  };
  auto get_string = [&](const std::string& field) -> std::optional<std::string> {
    std::string path = table_ + "." + field;
    if (!c.has(path)) return std::nullopt;
    return c.get_string(path);
  };
  auto get_list = [&](const std::string& field) -> std::optional<std::vector<std::string>> {
    std::string path = table_ + "." + field;
    if (!c.has(path)) return std::nullopt;
    return c.get_string_list(path);
  };

  Role role = Role::Worker;
  if (auto text = get_string("role")) {
    auto parsed = roles::parse_role(*text);
    if (!parsed) namer.fail("role", namer.show("role", "\"" + *text + "\"") + " must be \"worker\" or \"server\"");
    role = *parsed;
  }
  roles::RawRole r;
  r.rank = get_int("rank");
  r.world_size = get_int("world_size");
  r.local_rank = get_int("local_rank");
  r.local_world_size = get_int("local_world_size");
  r.node_rank = get_int("node_rank");
  r.nnodes = get_int("nnodes");
  r.worker_endpoints = get_list("worker_endpoints");
  r.server_endpoints = get_list("server_endpoints");
  r.current_endpoint = get_string("current_endpoint");
  r.store = get_string("store");
  r.job_id = get_string("job_id").value_or("");
  return roles::build(r, role, namer, "toml");
}

}  // namespace dtrain
