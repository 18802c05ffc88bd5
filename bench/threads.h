#pragma once
// Where a worker process's CPU goes, by thread (/proc/self/task): for
// dtrain-bench training's THREADS and THREADDETAIL lines.

#include <string>
#include <vector>

namespace dtrain::bench {

// CPU time (ns) and context switches of one thread of this process.
struct ThreadSample {
  long tid = 0;
  double cpu_ns = 0, nvcsw = 0, vcsw = 0;  // nvcsw: involuntary, vcsw: voluntary
  std::string name;
};

// Every thread of this process, now.
std::vector<ThreadSample> sample_threads();

// Prints, per step between the samples before and after: "THREADS main_cpu_ms
// other_cpu_ms main_preemptions threads torch_threads" and "THREADDETAIL"
// (each thread's CPU ms and sleeps per step). main_tid: the training thread.
void print_thread_report(const std::vector<ThreadSample>& before, const std::vector<ThreadSample>& after, long main_tid,
                         int steps, int torch_threads);

}  // namespace dtrain::bench
