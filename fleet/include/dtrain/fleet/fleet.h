#pragma once

// dtrain for a user's own libtorch program: Paddle's Fleet API in C++.
//
//   #include <dtrain/fleet/fleet.h>
//   namespace fleet = dtrain::fleet;
//   fleet::init();                                          // fleet.init(is_collective=True)
//   auto model = std::make_shared<Net>();
//   fleet::distributed_model(model);                        // fleet.distributed_model(model)
//   auto opt = fleet::distributed_optimizer(                // fleet.distributed_optimizer(opt)
//       std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1)));
//   for (...) { auto loss = ...; loss.backward(); opt->step(); opt->zero_grad(); }
//
// Built as libdtrain_fleet (find_package(dtrain COMPONENTS fleet) -> dtrain::fleet).
// The core and the SDK know nothing of libtorch; this library is the bridge.
//
// Threads: everything here is called from the training thread. All functions
// that communicate (init, barrier_worker, metrics, the wrappers' steps) are
// collective: every worker calls them in the same order.
//
// Parameter-server mode (Paddle's fleet.init(is_collective=False),
// init_worker/init_server/run_server) is in dtrain/fleet/ps.h (docs/api.md):
// init() with is_collective = false joins the PS job; init() with
// is_collective = true in a process whose role is a server throws
// InvalidUsage.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/config.h"
#include "dtrain/job.h"
#include "dtrain/role_maker.h"
#include "dtrain/strategy.h"
#include "dtrain/fleet/amp.h"
#include "dtrain/fleet/blocks.h"
#include "dtrain/fleet/data_parallel.h"
#include "dtrain/fleet/elastic.h"
#include "dtrain/fleet/metrics.h"
#include "dtrain/fleet/optimizer.h"
#include "dtrain/fleet/optimizers.h"
#include "dtrain/fleet/sharding.h"
#include "dtrain/fleet/sync_batch_norm.h"

namespace dtrain::fleet {

// Paddle's DistributedStrategy; the [strategy] table of a job file fills it
// (StrategyOptions::from_config), or set its fields in code.
using DistributedStrategy = StrategyOptions;

struct InitOptions {
  bool is_collective = true;
  // A job file (TOML) to read [job] backend, [communicator] timeout_s,
  // [plugins] path, [strategy] and [role] from; overrides as "key.path=value".
  // Empty: none (environment and defaults only).
  std::string job_file;
  std::vector<std::string> overrides;
  // An already loaded (and validated) job file instead of job_file; an app with
  // its own keys passes it here.
  std::shared_ptr<const Config> config;
  // The transport plugin. Empty: as JobOptions::from_config reads it
  // (DTRAIN_BACKEND from the launcher, else the job file's [job] backend).
  std::string backend;
  // Overrides the job file's [strategy] when set.
  std::optional<DistributedStrategy> strategy;
  // Deadline of init's rendezvous and of every collective; 0: the job file's
  // communicator.timeout_s (default 300 s).
  std::chrono::milliseconds timeout{0};
};

// fleet.init: finds this process's role (the dtrain launcher's DTRAIN_*,
// Paddle's PADDLE_*, Slurm, Open MPI, torchrun's RANK/WORLD_SIZE/MASTER_ADDR,
// the job file's [role], else a single process), joins the job's store (under
// mpirun/Slurm/torchrun rank 0 serves it) and creates one communicator over
// all workers. Blocks until every worker has joined. Once per process: a
// second call throws InvalidUsage. Errors name the variable, key or rank.
void init(const InitOptions& options = {});
// fleet.init(is_collective=...) shorthand.
void init(bool is_collective);
bool is_initialized();
// Leaves the job: drops the distributed models and optimizers' registration
// and the communicator. Optional (exit does it); after it init() may run again.
void shutdown();

// Rank and world queries (Paddle names). Before init() they throw InvalidUsage.
int worker_index();
int worker_num();
bool is_first_worker();
int local_rank();
// All workers wait for each other (fleet.barrier_worker()).
void barrier_worker();

const RoleInfo& role();
const DistributedStrategy& strategy();
// The communicator over all workers (null with one worker and no store).
std::shared_ptr<Communicator> communicator();

// fleet.distributed_model: makes `model` data-parallel: checks every worker
// built the same parameters (a mismatch names the first differing one on
// every rank), broadcasts rank 0's parameters and buffers, and registers
// gradient hooks so buckets are all-reduced while backward still runs. The
// caller keeps calling its own module's forward(); the returned object holds
// the buckets and is kept by the library until shutdown(). Throws
// InvalidUsage before init().
std::shared_ptr<DataParallel> distributed_model(std::shared_ptr<::torch::nn::Module> model);
template <typename Impl>
std::shared_ptr<DataParallel> distributed_model(const ::torch::nn::ModuleHolder<Impl>& model) {
  return distributed_model(std::static_pointer_cast<::torch::nn::Module>(model.ptr()));
}

// fleet.distributed_optimizer: wraps the user's optimizer so each step() applies
// the strategy (gradient merge, local SGD, fp16 all-reduce through the buckets)
// for every model given to distributed_model(), before or after this call.
// Throws InvalidUsage before init().
std::shared_ptr<DistributedOptimizer> distributed_optimizer(std::shared_ptr<::torch::optim::Optimizer> optimizer);

}  // namespace dtrain::fleet
