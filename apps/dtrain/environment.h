#pragma once

#include <map>
#include <string>

#include "plan.h"

namespace dtrain::launch {

// The variables one process of the job gets on top of dtrain's own environment:
// DTRAIN_* (read by the core's role maker) and Paddle's PADDLE_* / TRAINING_ROLE.
std::map<std::string, std::string> process_environment(const JobPlan& plan, const Slot& s, int attempt);

}  // namespace dtrain::launch
