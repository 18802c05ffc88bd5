#include "dtrain/job.h"

#include <cstdlib>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"
#include "job/job_store.h"

namespace dtrain {

void add_job_keys(ConfigSchema& schema) {
  schema.add("job.backend", ConfigType::String, "\"gloo\"", "transport plugin (dtrain --backend overrides)")
      .add("job.program", ConfigType::String, "\"\"", "program the launcher starts for `dtrain JOB.toml`")
      .add("job.args", ConfigType::StringList, "[]", "extra arguments after the job file")
      .add("job.nproc_per_node", ConfigType::Int, "1", "processes per machine")
      .add("job.job_id", ConfigType::String, "\"\"", "job id (default: a fresh one)")
      .add("communicator.timeout_s", ConfigType::Float, "300", "default deadline of every collective")
      .add("plugins.path", ConfigType::StringList, "[]", "extra folders searched for plugins")
      .add_open_table("role");
  for (const std::string& name : PluginRegistry().available()) schema.add_open_table(name);
}

RoleInfo resolve_role(const Config* config) {
  EnvRoleMaker env;
  if (env.applies() || !config || !config->has("role")) return env.resolve();
  return TomlRoleMaker(*config).resolve();
}

JobOptions JobOptions::from_config(const Config& config) {
  JobOptions o;
  const char* launched = std::getenv("DTRAIN_BACKEND");
  o.backend = launched && *launched ? launched : config.get_string("job.backend");
  o.config_toml = config.table_as_flat_toml(o.backend);
  if (config.has("plugins.path")) o.plugin_dirs = config.get_string_list("plugins.path");
  double secs = config.get_float("communicator.timeout_s");
  if (secs <= 0) {
    ConfigLocation loc = config.location_of("communicator.timeout_s");
    throw ConfigError(loc.file, loc.line, loc.column, "communicator.timeout_s",
                      "communicator.timeout_s must be positive");
  }
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(secs * 1000));
  return o;
}

Job join_job(const JobOptions& options, const RoleInfo& role) {
  if (options.backend.empty()) throw InvalidUsage("join_job: no backend named (set [job] backend)");
  Job job;
  job.role = role;
  PluginRegistry registry(options.plugin_dirs);
  job.backend = registry.load(options.backend);

  if (role.world_size > 1 || !role.store_endpoint.empty()) {
    if (role.store_endpoint.empty())
      throw InvalidUsage("rank " + std::to_string(role.rank) + " of " + std::to_string(role.world_size) +
                         " has no store endpoint (DTRAIN_STORE); start the job with `dtrain`");
    JobStore js =
        connect_job_store(role, role.rank == 0 && role.role == Role::Worker, role.nnodes > 1, options.timeout);
    job.store_server = js.server;
    job.store = js.store;
  }

  CommOptions co = worker_comm_options(role, job.store, options.name, options.config_toml, options.timeout);
  co.role = role.role;
  job.comm = job.backend->create_communicator(co);
  return job;
}

std::shared_ptr<Store> connect_store(const RoleInfo& role, std::chrono::milliseconds timeout) {
  if (role.store_endpoint.empty()) return nullptr;
  return connect_job_store(role, false, role.nnodes > 1, timeout).store;
}

}  // namespace dtrain
