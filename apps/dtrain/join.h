#pragma once
// The launchers meet: node 0 serves the job store, every machine connects to
// it and publishes what it runs; the machines' descriptions give the ranks.

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "dtrain/store.h"
#include "plan.h"

namespace dtrain::launch {

struct JobStore {
  std::unique_ptr<TcpStoreServer> server;  // node 0's
  std::shared_ptr<Store> root;             // the job store itself (the processes' keys)
  std::shared_ptr<Store> launch;           // the launchers' keys, under "launch/"
};

// A cut link leaves a request unanswered, not refused: every launcher's store
// client gives up after this, the limit after which the others declare it dead.
constexpr std::chrono::seconds kPeerSilenceLimit{15};

// An option's seconds as the milliseconds a deadline or a wait takes.
inline std::chrono::milliseconds seconds_ms(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

// Serves the store (node 0), connects to it and fixes the job id and token in
// p. A machine joined by --master without --rank takes its index from the
// store, except in an elastic job (its generations number the machines).
JobStore open_job_store(JobPlan& p);

// A connection of its own to the job store (once open_job_store has found
// it), scoped to the launchers' keys: for a thread of the launcher.
std::shared_ptr<Store> connect_launch_store(const JobPlan& p);

// Publishes this machine's description, waits for every machine's (the
// options' join timeout; `interrupted` is polled and may throw) and lays out
// the ranks (set_machines).
void exchange_node_info(JobPlan& p, Store& launch, const std::function<void()>& interrupted);

// This machine's description for the other machines (node: its index, or its elastic id).
NodeInfo describe_machine(const JobPlan& p, int node);

// The job's machines in node order, this one at `self`: the slots' global
// indices and the job's endpoints in rank order (unless listed).
void set_machines(JobPlan& p, std::vector<NodeInfo> nodes, int self);

}  // namespace dtrain::launch
