#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/config.h"
#include "dtrain/role_maker.h"

namespace dtrain {

class Backend;
class Communicator;
class Store;
class TcpStoreServer;

// The job file's keys that the core owns. Apps add their own tables to the
// same schema; a backend's table "[<backend>]" is open here and checked against
// the plugin's key list when its communicator is created.
//
//   [job]           backend = "gloo"        transport plugin (`dtrain --backend` overrides)
//                   program = "dtrain-cls"  what the launcher starts for `dtrain JOB.toml`
//                                           (a bare name is looked up next to `dtrain`)
//                   nproc_per_node = 2      processes per machine unless the command line says
//                   job_id = ""             defaults to a fresh id from the launcher
//   [communicator]  timeout_s = 300         default deadline of every collective
//   [plugins]       path = []               extra folders searched for plugins
//   [role]          user-defined role (TomlRoleMaker), used only when the
//                   environment names no rank
void add_job_keys(ConfigSchema& schema);

// Picks the role maker the way Paddle's fleet does, first that applies:
// the dtrain launcher (DTRAIN_*), Paddle (PADDLE_*), Slurm (SLURM_PROCID...),
// Open MPI (OMPI_COMM_WORLD_*), torchrun (RANK/WORLD_SIZE/MASTER_ADDR), the
// config's [role] table; otherwise a single process (rank 0 of 1).
RoleInfo resolve_role(const Config* config = nullptr);

struct JobOptions {
  std::string backend;      // required
  std::string config_toml;  // the backend's own table, flat
  std::vector<std::string> plugin_dirs;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string name = "default";  // communicator name (store scope)
  // Reads backend, timeout, plugin path and the backend's table from a job file.
  // The backend has one channel from the launcher: DTRAIN_BACKEND (set by
  // `dtrain` from --backend or the job file's [job] backend) wins over the
  // file's [job] backend, whose declared default is "gloo".
  static JobOptions from_config(const Config& config);
};

// This process's membership in a job: its role, the shared store and one
// communicator over all workers. join_job blocks until every worker has joined
// (or options.timeout passes).
//
// Store: the launcher's TcpStore (DTRAIN_STORE + DTRAIN_JOB_TOKEN). Without a
// launcher (Slurm, mpirun, torchrun), rank 0 serves a TcpStore itself on the
// store endpoint's port (MASTER_ADDR:MASTER_PORT, or DTRAIN_STORE) and the
// others connect to it, so a program runs under those schedulers unchanged.
struct Job {
  RoleInfo role;
  std::shared_ptr<TcpStoreServer> store_server;  // set when this process serves the store
  std::shared_ptr<Store> store;                  // null for a single process
  std::shared_ptr<Backend> backend;
  std::shared_ptr<Communicator> comm;
};
Job join_job(const JobOptions& options, const RoleInfo& role);

// The store of a job started by `dtrain` (role.store_endpoint with the job's
// token, DTRAIN_STORE / DTRAIN_JOB_TOKEN), scoped to this attempt's keys as
// join_job's is; null when the role names no store. Never serves one. For
// programs that build their own communicators over the job's store (the
// Python c10d backend), so a dead rank feeds the launcher's report.
std::shared_ptr<Store> connect_store(const RoleInfo& role, std::chrono::milliseconds timeout);

}  // namespace dtrain
