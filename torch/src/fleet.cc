#include "dtrain/torch/fleet.h"

#include <cstdlib>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "fleet_state.h"

namespace dtrain::torch {

namespace {

std::unique_ptr<detail::FleetState>& slot() {
  static std::unique_ptr<detail::FleetState> s;
  return s;
}

}  // namespace

detail::FleetState& detail::state(const char* what) {
  auto& s = slot();
  if (!s)
    throw InvalidUsage(std::string("dtrain::torch::") + what +
                       " called before dtrain::torch::init(): call init() first (it finds this worker's rank and "
                       "joins the job)");
  return *s;
}

void init(const InitOptions& o) {
  if (slot()) throw InvalidUsage("dtrain::torch::init called twice (call shutdown() before joining again)");
  if (!o.is_collective)
    throw NotSupported(
        "dtrain::torch::init: the parameter-server mode (is_collective = false) is not available in "
        "dtrain::torch yet; use is_collective = true (data parallelism)");
  Config file;
  const Config* cfg = o.config.get();
  if (!cfg && !o.job_file.empty()) {
    file = Config::from_file(o.job_file, o.overrides);
    ConfigSchema schema;
    add_job_keys(schema);
    add_strategy_keys(schema);
    // A user's own tables are open: only dtrain's keys are checked.
    for (const auto& table : file.keys_of(""))
      if (table != "job" && table != "communicator" && table != "plugins" && table != "role" && table != "strategy")
        schema.add_open_table(table);
    file.validate(schema);
    cfg = &file;
  } else if (!cfg && !o.overrides.empty()) {
    throw InvalidUsage("dtrain::torch::init: overrides given without a job file");
  }
  if (!cfg) cfg = &file;

  RoleInfo role = resolve_role(cfg);
  if (role.role != Role::Worker)
    throw NotSupported("dtrain::torch::init: this process's role is '" + std::string(to_string(role.role)) + "' (" +
                       role.source +
                       "), but only collective workers are supported; parameter servers are not "
                       "available in dtrain::torch yet");
  JobOptions jo = JobOptions::from_config(*cfg);
  if (!o.backend.empty())
    jo.backend = o.backend;
  else if (const char* env = std::getenv("DTRAIN_BACKEND"); env && *env)
    jo.backend = env;
  if (jo.backend != cfg->get_string("job.backend", "gloo")) jo.config_toml = cfg->table_as_flat_toml(jo.backend);
  if (o.timeout.count() > 0) jo.timeout = o.timeout;

  auto s = std::make_unique<detail::FleetState>();
  s->strategy = o.strategy ? *o.strategy : StrategyOptions::from_config(*cfg);
  s->job = join_job(jo, role);
  slot() = std::move(s);
}

void init(bool is_collective) {
  InitOptions o;
  o.is_collective = is_collective;
  init(o);
}

bool is_initialized() { return slot() != nullptr; }

void shutdown() { slot().reset(); }

int worker_index() { return detail::state("worker_index").job.role.rank; }
int worker_num() { return detail::state("worker_num").job.role.world_size; }
bool is_first_worker() { return detail::state("is_first_worker").job.role.rank == 0; }
int local_rank() { return detail::state("local_rank").job.role.local_rank; }

void barrier_worker() {
  auto& s = detail::state("barrier_worker");
  if (s.job.comm && s.job.comm->size() > 1) s.job.comm->barrier()->wait();
}

const RoleInfo& role() { return detail::state("role").job.role; }
const DistributedStrategy& strategy() { return detail::state("strategy").strategy; }
std::shared_ptr<Communicator> communicator() { return detail::state("communicator").job.comm; }

std::shared_ptr<DataParallel> distributed_model(std::shared_ptr<::torch::nn::Module> model) {
  auto& s = detail::state("distributed_model");
  if (!model) throw InvalidUsage("dtrain::torch::distributed_model: the model is null");
  for (auto& m : s.models->models)
    if (m->module() == model) throw InvalidUsage("dtrain::torch::distributed_model: this model is already distributed");
  auto dp = std::make_shared<DataParallel>(std::move(model), s.job.comm, s.strategy);
  s.models->add(dp);
  return dp;
}

std::shared_ptr<DistributedOptimizer> distributed_optimizer(std::shared_ptr<::torch::optim::Optimizer> optimizer) {
  auto& s = detail::state("distributed_optimizer");
  return std::make_shared<DistributedOptimizer>(std::move(optimizer), s.strategy, s.models);
}

}  // namespace dtrain::torch
