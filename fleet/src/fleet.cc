#include "dtrain/fleet/fleet.h"

#include <cstdlib>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "fleet_state.h"

namespace dtrain::fleet {

namespace {

std::unique_ptr<detail::FleetState>& slot() {
  static std::unique_ptr<detail::FleetState> s;
  return s;
}

}  // namespace

detail::FleetState& detail::state(const char* what) {
  auto& s = slot();
  if (!s)
    throw InvalidUsage(std::string("dtrain::fleet::") + what +
                       " called before dtrain::fleet::init(): call init() first (it finds this worker's rank and "
                       "joins the job)");
  return *s;
}

void detail::install(std::unique_ptr<FleetState> s) {
  if (slot()) throw InvalidUsage("dtrain::fleet::init called twice (call shutdown() before joining again)");
  slot() = std::move(s);
}

void init(const InitOptions& o) {
  if (slot()) throw InvalidUsage("dtrain::fleet::init called twice (call shutdown() before joining again)");
  std::shared_ptr<const Config> cfg = o.config;
  if (!cfg && !o.job_file.empty()) {
    auto file = std::make_shared<Config>(Config::from_file(o.job_file, o.overrides));
    ConfigSchema schema;
    add_job_keys(schema);
    add_strategy_keys(schema);
    ps::add_ps_keys(schema);
    // A user's own tables are open: only dtrain's keys are checked.
    for (const auto& table : file->keys_of(""))
      if (table != "job" && table != "communicator" && table != "plugins" && table != "role" && table != "strategy" &&
          table != "ps")
        schema.add_open_table(table);
    file->validate(schema);
    cfg = std::move(file);
  } else if (!cfg && !o.overrides.empty()) {
    throw InvalidUsage("dtrain::fleet::init: overrides given without a job file");
  }
  if (!cfg) cfg = std::make_shared<Config>();

  RoleInfo role = resolve_role(cfg.get());
  if (o.is_collective && role.role != Role::Worker)
    throw InvalidUsage("dtrain::fleet::init: this process is a parameter server (" + role.source +
                       "), but init was called with is_collective = true; a program started with servers calls "
                       "init(false) (Paddle's fleet.init(is_collective=False))");
  if (!o.is_collective) {
    auto s = std::make_unique<detail::FleetState>();
    s->config = cfg;
    // A strategy given in code overrides the file's, PS mode included, and
    // gets the checks the file's [strategy] gets (resolved_ps_mode).
    s->strategy = o.strategy ? *o.strategy : StrategyOptions::from_config(*cfg);
    s->strategy.ps_mode = s->strategy.resolved_ps_mode();
    s->ps = std::make_unique<ps::PsJob>(ps::join_ps(*cfg, role, s->strategy.ps_mode));
    s->job.role = s->ps->role;
    s->job.store = s->ps->store;
    s->job.comm = s->ps->collective;
    slot() = std::move(s);
    return;
  }
  auto strategy = o.strategy ? *o.strategy : StrategyOptions::from_config(*cfg);
  if (strategy.a_sync)
    throw InvalidUsage(
        "dtrain::fleet::init: [strategy] a_sync = true asks for parameter-server training, but init was called for "
        "a collective job (is_collective = true); remove a_sync, or start servers (dtrain --server_num S "
        "--worker_num W) and call init(false)");
  JobOptions jo = JobOptions::from_config(*cfg);
  if (!o.backend.empty()) {
    jo.backend = o.backend;
    jo.config_toml = cfg->table_as_flat_toml(jo.backend);
  }
  if (o.timeout.count() > 0) jo.timeout = o.timeout;

  auto s = std::make_unique<detail::FleetState>();
  s->config = cfg;
  s->strategy = strategy;
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
  detail::flush_in_flight(s);
  if (s.job.comm && s.job.comm->size() > 1) s.job.comm->barrier(CallOptions::wait_now());
}

const RoleInfo& role() { return detail::state("role").job.role; }
const DistributedStrategy& strategy() { return detail::state("strategy").strategy; }
std::shared_ptr<Communicator> communicator() { return detail::state("communicator").job.comm; }

std::shared_ptr<DataParallel> distributed_model(std::shared_ptr<::torch::nn::Module> model) {
  auto& s = detail::state("distributed_model");
  if (s.ps)
    throw InvalidUsage(
        "dtrain::fleet::distributed_model is for collective jobs; in a parameter-server job (init(false)) put the "
        "model's weights on the servers with ps_optimizer() / DenseParameters and SparseEmbedding");
  if (!model) throw InvalidUsage("dtrain::fleet::distributed_model: the model is null");
  for (auto& m : s.models->models())
    if (m->module() == model) throw InvalidUsage("dtrain::fleet::distributed_model: this model is already distributed");
  auto dp = std::make_shared<DataParallel>(std::move(model), s.job.comm, s.strategy);
  s.models->add(dp);
  return dp;
}

std::shared_ptr<DistributedOptimizer> distributed_optimizer(std::shared_ptr<::torch::optim::Optimizer> optimizer) {
  auto& s = detail::state("distributed_optimizer");
  return std::make_shared<DistributedOptimizer>(std::move(optimizer), s.strategy, s.models);
}

}  // namespace dtrain::fleet
