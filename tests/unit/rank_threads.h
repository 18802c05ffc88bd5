#pragma once
// Test helper: ranks as threads of this process over one MemoryStore.

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "dtrain/communicator.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"

namespace dtrain::test {

// Runs fn(rank, comm) on `world` threads, each with its own communicator of
// `backend`; an exception on a rank is a test failure naming that rank.
template <typename F>
void run_rank_threads(const std::string& backend, int world, std::chrono::milliseconds timeout, F fn) {
  auto be = PluginRegistry().load(backend);
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommOptions o;
        o.rank = r;
        o.world_size = world;
        o.local_world_size = world;
        o.store = store;
        o.timeout = timeout;
        std::shared_ptr<Communicator> comm = be->create_communicator(o);
        fn(r, comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace dtrain::test
