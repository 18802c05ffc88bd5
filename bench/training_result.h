#pragma once
// dtrain-bench training: what one configuration's ranks measured, read from
// the lines each worker prints (RESULT, PHASES, THREADS, THREADDETAIL and
// BWDEND; training.cc's run_worker and threads.cc write them).

#include <string>
#include <vector>

namespace dtrain::bench {

struct Result {
  double ips = 0, step_ms = 0, comm_ms = 0;
  // Per step, medians over the timed steps, averaged over ranks: forward (with
  // the loss), backward (with the gradient hooks), blocked on gradient sync
  // after backward, optimizer step.
  double fwd_ms = 0, bwd_ms = 0, sync_ms = 0, opt_ms = 0;
  // Median over steps of the gap between the two ranks' ends of backward
  // (-1 with one rank).
  double skew_ms = -1;
  // CPU time per step: the training thread, every other thread of the
  // process (communication, Gloo's I/O loop, the watchdog); and the training
  // thread's involuntary context switches per step. Averaged over ranks.
  double main_cpu_ms = 0, other_cpu_ms = 0, preempt = 0;
  int threads = 0;
  std::string rank0_threads;  // rank 0's THREADDETAIL line
};

// The ranks' outputs of one run of `impl` with `world` workers: rank 0's
// RESULT, the other lines averaged over ranks, the skew between two lock-step
// ranks' ends of backward. Throws when rank 0 printed no RESULT.
Result parse_ranks(const std::vector<std::string>& texts, const std::string& impl, int world);

}  // namespace dtrain::bench
