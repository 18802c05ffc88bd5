// dtrain-bench: benchmarks of dtrain's backends, each compared in the same
// invocation with a reference that does not go through dtrain.
//
//   dtrain-bench collectives --backend gloo --world-size 2

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "collectives.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  CLI::App app{"dtrain-bench: benchmarks of dtrain backends against raw references"};
  app.require_subcommand(1);
  dtrain::bench::CollectivesOptions coll;
  auto* c = app.add_subcommand("collectives",
                               "time a collective over a range of sizes (nccl-tests style), with raw Gloo and "
                               "Open MPI as references");
  dtrain::bench::add_collectives_options(c, coll);
  CLI11_PARSE(app, argc, argv);
  if (c->parsed()) return dtrain::bench::run_collectives(coll, args);
  return 2;
}
