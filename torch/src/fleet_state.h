#pragma once

#include <memory>

#include "dtrain/job.h"
#include "dtrain/strategy.h"
#include "dtrain/torch/optimizer.h"

namespace dtrain::torch::detail {

// The process's fleet context, set by init() and cleared by shutdown().
struct FleetState {
  Job job;
  StrategyOptions strategy;
  std::shared_ptr<ModelSet> models = std::make_shared<ModelSet>();
};

// Throws InvalidUsage naming `what` when init() has not run.
FleetState& state(const char* what);

}  // namespace dtrain::torch::detail
