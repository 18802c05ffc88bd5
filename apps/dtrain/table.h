#pragma once

#include "plan.h"

namespace dtrain::launch {

// Prints the distributed environment table (machines, store, token source,
// every local process with its rank, endpoint and log) and writes
// <log_dir>/endpoints.log. Creates log_dir; throws IoError when it cannot.
void print_job_table(const JobPlan& plan);

}  // namespace dtrain::launch
