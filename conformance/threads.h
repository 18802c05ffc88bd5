#pragma once
// Ranks as threads: one process runs every rank of a communicator, each on its
// own thread with its own communicator over one in-memory store. Used by
// dtrain-conformance --world-size N and by dtrain's own unit tests.

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/communicator.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"

namespace dtrain::conformance {

// Runs fn(rank, comm) on `world` threads. base holds what every rank shares
// (timeout, name, config_toml, and the store: a new MemoryStore if none);
// rank, world size, local rank and local world size (all ranks on this host)
// are set here. Returns each rank's
// error: "" when fn returned, else the what() of what it (or communicator
// creation) threw.
inline std::vector<std::string> run_rank_threads(
    Backend& backend, const CommOptions& base, int world,
    const std::function<void(int rank, const std::shared_ptr<Communicator>& comm)>& fn) {
  std::shared_ptr<Store> store = base.store ? base.store : std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommOptions o = base;
        o.rank = r;
        o.world_size = world;
        o.local_rank = r;
        o.local_world_size = world;
        o.store = store;
        fn(r, backend.create_communicator(o));
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "exception without a message";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace dtrain::conformance
