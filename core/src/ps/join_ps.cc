// join_ps: a process's membership in a PS job (store, PS communicator, and
// the workers' side collective communicator).
#include <algorithm>

#include "common/log.h"
#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"
#include "dtrain/strategy.h"
#include "job/job_store.h"
#include "ps/ps_internal.h"

namespace dtrain::ps {

namespace {

// A positive number of seconds: the key's value, else its declared default.
std::chrono::milliseconds seconds_key(const Config& c, const std::string& key) {
  double s = c.get_float(key);
  if (!(s > 0)) {
    ConfigLocation loc = c.location_of(key);
    throw ConfigError(loc.file.empty() ? c.source() : loc.file, loc.line, loc.column, key, "must be positive");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

bool loopback(const std::string& endpoint) {
  std::string host = parse_host_port(endpoint).first;
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// One machine: the launcher says so (nnodes); Paddle's variables set by hand
// do not, so then only loopback endpoints mean one machine.
bool single_host(const RoleInfo& role) {
  if (role.nnodes > 1) return false;
  if (!role.self_hosted_store) return true;
  for (const auto& e : role.server_endpoints)
    if (!loopback(e)) return false;
  return true;
}

}  // namespace

PsJob join_ps(const Config& config, const RoleInfo& role) {
  return join_ps(config, role, StrategyOptions::from_config(config).ps_mode);
}

PsJob join_ps(const Config& config, const RoleInfo& role, const ModeOptions& mode) {
  PsJob job;
  job.role = role;
  std::string backend_name = config.get_string("ps.backend");
  std::string collective = config.get_string("ps.collective");
  auto timeout = seconds_key(config, "ps.timeout_s");
  auto comm_timeout = seconds_key(config, "communicator.timeout_s");
  CheckpointOptions ckpt;
  ckpt.dir = config.get_string("ps.checkpoint_dir");
  ckpt.save_on_exit = config.get_bool("ps.save_on_exit");
  ckpt.restart_count = role.restart_count;

  int num_servers = role.num_servers > 0 ? role.num_servers : static_cast<int>(role.server_endpoints.size());
  if (num_servers < 1)
    throw InvalidUsage("join_ps: this " + std::string(to_string(role.role)) + " (" + role.source +
                       ") knows of no parameter servers; start the job with `dtrain --server_num S --worker_num W`, "
                       "or set PADDLE_PSERVERS_IP_PORT_LIST");
  if (role.role == Role::Server && (role.server_index < 0 || role.server_index >= num_servers))
    throw InvalidUsage("join_ps: server index " + std::to_string(role.server_index) + " is outside the " +
                       std::to_string(num_servers) + " servers of the job");
  std::vector<std::string> dirs;
  if (config.has("plugins.path")) dirs = config.get_string_list("plugins.path");
  PluginRegistry registry(dirs);
  job.backend = registry.load(backend_name);

  if (role.store_endpoint.empty())
    throw InvalidUsage("join_ps: " + role.describe() +
                       " has no store endpoint (DTRAIN_STORE); start the job with "
                       "`dtrain`, or set Paddle's PS variables (the first server serves the store)");
  JobStore js =
      connect_job_store(role, role.role == Role::Server && role.server_index == 0, !single_host(role), timeout);
  job.store_server = js.server;
  job.store = js.store;

  CommOptions co;
  co.role = role.role;
  co.rank = role.role == Role::Server ? role.server_index : role.rank;
  co.world_size = role.world_size;
  co.local_rank = role.local_rank;
  co.local_world_size = role.local_world_size;
  // A PS backend binds loopback when every process is on this host
  // (local_world_size >= world_size): say so for servers too, whose local
  // count is of servers, not of workers.
  if (single_host(role)) co.local_world_size = std::max(role.local_world_size, role.world_size);
  co.store = job.store;
  co.config_toml = config.table_as_flat_toml(backend_name);
  co.timeout = timeout;
  co.name = "ps";
  co.job_id = role.job_id;
  co.num_servers = num_servers;
  co.num_workers = role.world_size;
  co.job_token = js.token;
  if (role.role == Role::Server) {
    job.server = start_server(job.backend, co);
    return job;
  }
  job.worker = connect_worker(job.backend, co, mode, ckpt);
  if (!collective.empty()) {
    job.collective = registry.load(collective)
                         ->create_communicator(worker_comm_options(
                             role, job.store, "ps.collective", config.table_as_flat_toml(collective), comm_timeout));
  }
  return job;
}

}  // namespace dtrain::ps
