#pragma once
// A process's connection to its job's store, shared by join_job and join_ps.
// Under the launcher the store already runs and the role carries its token.
// Without one (torchrun, mpirun, Slurm or Paddle's variables) one process of
// the job serves the store itself: on one machine on the given loopback-or-host
// address with a token derived from the job id; on several machines only with a
// shared secret (dtrain/job_secret.h) and bound to the one address the other
// machines dial, never to every interface.

#include <chrono>
#include <memory>

#include "dtrain/communicator.h"
#include "dtrain/role_maker.h"
#include "dtrain/store.h"

namespace dtrain {

struct JobStore {
  std::shared_ptr<TcpStoreServer> server;  // set when this process serves the store
  std::shared_ptr<Store> store;            // the attempt's key space: "run<restart_count>/"
  std::string token;                       // the token the store checks; never printed
};

// Connects to (and, when `serves` and the role hosts its own store, first
// starts) the store at role.store_endpoint. `multi_machine`: the store is
// dialled from other machines. Throws InvalidUsage when a self-hosted job on
// several machines has no secret (saying how to provide one) or when the store
// address resolves to loopback on the serving machine; StoreError when the
// store cannot be reached before `timeout`.
JobStore connect_job_store(const RoleInfo& role, bool serves, bool multi_machine, std::chrono::milliseconds timeout);

// A collective communicator's options for `role` as a worker of the job:
// its ranks, the job's store and id, and the name, backend keys and timeout.
CommOptions worker_comm_options(const RoleInfo& role, std::shared_ptr<Store> store, std::string name,
                                std::string config_toml, std::chrono::milliseconds timeout);

}  // namespace dtrain
