#pragma once

#include <map>
#include <string>

#include "plan.h"

namespace dtrain::launch {

// The variables one process of the job gets on top of dtrain's own environment,
// every environment source declared here, in one place:
// - DTRAIN_* (read by the core's role maker);
// - Paddle's PADDLE_* / TRAINING_ROLE / POD_IP;
// - torchrun's (workers only): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//   GROUP_RANK, GROUP_WORLD_SIZE, ROLE_*, MASTER_ADDR/MASTER_PORT (worker 0's
//   endpoint), TORCHELASTIC_{RESTART_COUNT,MAX_RESTARTS,RUN_ID,ERROR_FILE}, and
//   GLOO_SOCKET_IFNAME (this machine's job interface) unless the user set it;
// - OMP_NUM_THREADS=1 with several processes on the machine and none set
//   (torchrun's rule; see sets_omp_threads);
// - PYTHONPATH with dtrain's Python package first (before the user's).
std::map<std::string, std::string> process_environment(const JobPlan& plan, const Slot& s, int attempt);

// Whether the processes get OMP_NUM_THREADS=1 (several on this machine, and
// the user's environment sets none): the launcher prints torchrun's notice.
bool sets_omp_threads(const JobPlan& plan);

}  // namespace dtrain::launch
