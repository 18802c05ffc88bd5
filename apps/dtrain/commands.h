#pragma once

#include <string>
#include <vector>

#include "layout.h"
#include "dtrain/job_secret.h"

namespace dtrain::launch {

// `dtrain plugins`: the installed backends as a table; with keys, then each
// backend's keys ([NAME] table of a job file): name, type, default and doc,
// as its own key table declares them (an int key's bound ends its doc).
// Returns the exit code.
int list_plugins(const std::vector<std::string>& extra_dirs, bool keys = false);

struct CheckOptions {
  MachineOptions machines;  // laid out exactly as the job lays them out
  SecretOptions secret;
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
