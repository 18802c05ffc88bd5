// dtrain-bench: benchmarks of dtrain's backends, each compared in the same
// invocation with a reference that does not go through dtrain.
//
//   dtrain-bench collectives --backend gloo --world-size 2
//   dtrain-bench training apps/cls.toml     (execs dtrain-bench-training, built with libtorch)

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "collectives.h"
#include "process.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "training") {
    std::string exe = dtrain::bench::dir_of(dtrain::bench::self_exe()) + "/dtrain-bench-training";
    argv[1] = const_cast<char*>(exe.c_str());
    execv(exe.c_str(), argv + 1);
    std::fprintf(stderr, "dtrain-bench: cannot run %s: %s (it is built only when libtorch is installed)\n", exe.c_str(),
                 std::strerror(errno));
    return 2;
  }
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
