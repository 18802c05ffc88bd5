#pragma once
// Test helper: the conformance library's ranks-as-threads harness, with an
// exception on a rank reported as a test failure naming that rank.

#include <chrono>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "dtrain/communicator.h"
#include "dtrain/plugin_registry.h"
#include "threads.h"  // conformance/: the ranks-as-threads harness

namespace dtrain::test {

template <typename F>
void run_rank_threads(const std::string& backend, int world, std::chrono::milliseconds timeout, F fn) {
  auto be = PluginRegistry().load(backend);
  CommOptions base;
  base.timeout = timeout;
  auto errors = conformance::run_rank_threads(*be, base, world, fn);
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace dtrain::test
