#pragma once
// `dtrain-bench collectives`: times one collective of a dtrain backend over a
// range of sizes, with ranks as processes on this host, and compares it in the
// same invocation with raw Gloo (the same algorithm, no dtrain) and Open MPI;
// with --backend nccl, on CUDA buffers, against raw NCCL (bench/nccl_reference.h).

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dtrain::bench {

struct CollectivesOptions {
  std::string backend;
  int world_size = 2;
  std::string op = "allreduce";
  std::string dtype = "f32";
  std::string min_bytes = "8";
  std::string max_bytes = "64M";
  int step_factor = 2;
  std::string iters = "auto";
  int warmup = 5;
  int trials = 0;  // 0: auto, from the op's time (see kTrialBudget)
  double target_ms = 10;
  std::vector<std::string> options;  // key=value, the backend's own options
  bool no_reference = false;
  bool no_gloo = false;
  bool no_mpi = false;
  bool no_nccl = false;
  bool no_check = false;
  bool no_dtrain = false;
  bool aa = false;            // a second raw-Gloo instance in dtrain's place (the noise floor)
  bool async = false;         // time submit + Work::wait() instead of the blocking call
  std::string mpi_transport;  // "" (Open MPI's default), tcp, sm
  int time_limit_s = 600;
  bool verbose = false;
};

// Registers the subcommand's options on `sub`, writing into `o`.
void add_collectives_options(CLI::App* sub, CollectivesOptions& o);

// Runs the benchmark: as the parent (starts the ranks, then the references,
// prints the table) or, when started by a parent, as one rank. `argv` is the
// full command line, reused to start the ranks. Returns the exit code.
int run_collectives(const CollectivesOptions& o, const std::vector<std::string>& argv);

}  // namespace dtrain::bench
