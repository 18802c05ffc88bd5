#pragma once

#include <string>
#include <vector>

namespace dtrain::launch {

// `dtrain plugins`: the installed backends as a table. Returns the exit code.
int list_plugins(const std::vector<std::string>& extra_dirs);

struct CheckOptions {
  std::vector<std::string> ips;
  std::string master;
  int nnodes = 1;
  int node_rank = -1;
  int start_port = 0;
  std::string backend;
  std::string job_id;
  double timeout_s = 5;  // for each network check
};

// `dtrain check`: pre-flight checks of this machine and of the job's store,
// printed as one table; every check is bounded by timeout_s. Run the same
// command on every machine: they compare versions through a temporary store
// served by node 0. Returns 0 when every check passed.
int run_check(const CheckOptions& options);

}  // namespace dtrain::launch
