#pragma once

#include <memory>

#include "dtrain/config.h"
#include "dtrain/job.h"
#include "dtrain/ps.h"
#include "dtrain/strategy.h"
#include "dtrain/torch/optimizer.h"

namespace dtrain::torch::detail {

// The process's fleet context, set by init() and cleared by shutdown().
struct FleetState {
  // Collective jobs: the communicator over the workers. PS jobs: role, store
  // and the workers' side communicator, copied from `ps`.
  Job job;
  // init_standalone: the in-process server; declared before `ps` so the
  // worker is destroyed (and finishes) first.
  std::unique_ptr<ps::PsServer> local_server;
  std::unique_ptr<ps::PsJob> ps;  // init(false)
  // Every PS table this worker's modules declared (save_persistables).
  std::vector<ps::SparseTable> sparse_tables;
  std::vector<ps::DenseTable> dense_tables;
  std::shared_ptr<const Config> config;
  StrategyOptions strategy;
  std::shared_ptr<ModelSet> models = std::make_shared<ModelSet>();
};

// Throws InvalidUsage naming `what` when init() has not run.
FleetState& state(const char* what);
// Installs s as the process's context; InvalidUsage if one is installed.
void install(std::unique_ptr<FleetState> s);

}  // namespace dtrain::torch::detail
