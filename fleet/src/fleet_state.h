#pragma once

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "dtrain/config.h"
#include "dtrain/job.h"
#include "dtrain/ps.h"
#include "dtrain/strategy.h"
#include "dtrain/work.h"
#include "dtrain/fleet/optimizer.h"

namespace dtrain::fleet::detail {

// Parameter-server ops a module left in flight (async mode,
// a_sync_configs.send_queue_size), oldest first, each with what keeps its
// buffers alive. Training thread only. The destructor waits for them all
// (their errors are dropped there: a module going away cannot report them).
class InFlight {
 public:
  ~InFlight();
  void add(std::shared_ptr<Work> work, std::shared_ptr<void> keep);
  // Waits for the oldest until at most n remain; rethrows an op's error.
  void wait_until(size_t n);
  size_t size() const { return ops_.size(); }

 private:
  std::deque<std::pair<std::shared_ptr<Work>, std::shared_ptr<void>>> ops_;
};

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
  // The modules' ops in flight, waited for before a barrier, a save and the
  // end (flush_in_flight).
  std::vector<std::weak_ptr<InFlight>> in_flight;
  std::shared_ptr<const Config> config;
  StrategyOptions strategy;
  std::shared_ptr<ModelSet> models = std::make_shared<ModelSet>();
};

// Throws InvalidUsage naming `what` when init() has not run.
FleetState& state(const char* what);
// Installs s as the process's context; InvalidUsage if one is installed.
void install(std::unique_ptr<FleetState> s);
// Waits for every module's ops in flight (s.in_flight).
void flush_in_flight(FleetState& s);

}  // namespace dtrain::fleet::detail
