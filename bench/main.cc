// dtrain-bench: benchmarks of dtrain's backends, each compared in the same
// invocation with a reference that does not go through dtrain.
//
//   dtrain-bench collectives --backend gloo --world-size 2
//   dtrain-bench training apps/cls.toml     (execs dtrain-bench-training, built with libtorch)
//   dtrain-bench training ctr               (execs dtrain-bench-ctr: the CTR app per PS mode)
//   dtrain-bench memory                     (execs dtrain-bench-memory: sharding stages 1-3 and recompute)
//   dtrain-bench store                      (execs dtrain-bench-store: the join at 1,024-8,192 ranks vs c10d's
//   TCPStore) dtrain-bench launch                     (execs dtrain-bench-launch: 2-32 ranks, time to the first
//   all-reduce) dtrain-bench ps                         (the PS backend against raw gRPC and Redis; built with gRPC +
//   hiredis)

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "collectives.h"
#include "process.h"
#if DTRAIN_BENCH_HAVE_PS
#include "ps.h"
#endif

int main(int argc, char** argv) {
  const std::string sub = argc > 1 ? argv[1] : "";
  if (sub == "memory" || sub == "store" || sub == "launch") {
    // Per-rank memory of the large-model strategies (bench/memory.cc, built with libtorch);
    // the store's join at thousands of ranks (bench/store.cc); the launcher at 2-32 ranks (bench/launch.cc).
    std::string exe = dtrain::bench::dir_of(dtrain::bench::self_exe()) + "/dtrain-bench-" + argv[1];
    argv[1] = const_cast<char*>(exe.c_str());
    execv(exe.c_str(), argv + 1);
    std::fprintf(stderr, "dtrain-bench: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    return 2;
  }
  if (argc > 1 && std::string(argv[1]) == "training") {
    // `training ctr` (or a ctr.toml job): the CTR app on the parameter server (bench/training_ctr.cc).
    const std::string arg2 = argc > 2 ? argv[2] : "";
    const bool ctr = arg2 == "ctr" || (arg2.size() >= 8 && arg2.compare(arg2.size() - 8, 8, "ctr.toml") == 0);
    std::string exe =
        dtrain::bench::dir_of(dtrain::bench::self_exe()) + (ctr ? "/dtrain-bench-ctr" : "/dtrain-bench-training");
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
#if DTRAIN_BENCH_HAVE_PS
  dtrain::bench::PsBenchOptions psopt;
  auto* ps = app.add_subcommand("ps",
                                "time a parameter-server backend's sparse and dense pulls and pushes, with a raw "
                                "gRPC echo server and Redis as references");
  dtrain::bench::add_ps_options(ps, psopt);
#endif
  CLI11_PARSE(app, argc, argv);
  if (c->parsed()) return dtrain::bench::run_collectives(coll, args);
#if DTRAIN_BENCH_HAVE_PS
  if (ps->parsed()) return dtrain::bench::run_ps_bench(psopt, args);
#endif
  return 2;
}
