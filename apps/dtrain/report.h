#pragma once
// The failure report: what one failed process or machine looks like, and the
// one root-cause report printed when the job fails.

#include <chrono>
#include <string>
#include <vector>

#include "messages.h"
#include "plan.h"
#include "process.h"

namespace dtrain::launch {

// Two failures this close together are a tie for the root cause; a process
// killed by a signal wins it, since its peers' errors follow within milliseconds.
constexpr std::chrono::milliseconds kSignalTieBreak{50};

// A process of this machine that exited non-zero or was killed: its rank,
// exit, machine and the last lines of its log. endpoint: where a server
// served ("" for workers).
Failure describe_exit(const JobPlan& plan, const Slot& s, const Process& p, int attempt,
                      const std::string& endpoint = "");

// A parameter server still running waited_s after every worker had finished
// and the launcher had set the stop key: it was killed (a failure, never a
// consequence).
Failure describe_stuck_server(const JobPlan& plan, const Slot& s, const Process& p, int attempt,
                              const std::string& endpoint, double waited_s);

// A failure of a machine or of dtrain itself (a signal, a lost heartbeat, the store).
Failure machine_failure(int64_t time_ms, const std::string& summary, const std::string& detail);

// Orders failures root cause first: failures before consequences (a process that
// only lost a peer), then by time, with kSignalTieBreak in favour of signals.
void order_by_root_cause(std::vector<Failure>& failures);

// The report for ordered failures (at least one): the root cause in full, then
// the next few in one line each.
std::string failure_report(const std::vector<Failure>& ordered, double grace_s);

}  // namespace dtrain::launch
