#include "threads.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace dtrain::bench {

std::vector<ThreadSample> sample_threads() {
  std::vector<ThreadSample> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    ThreadSample t;
    t.tid = std::stol(e.path().filename().string());
    std::ifstream(e.path() / "comm") >> t.name;
    std::ifstream ss(e.path() / "schedstat");
    ss >> t.cpu_ns;
    std::ifstream st(e.path() / "status");
    std::string line;
    while (std::getline(st, line))
      if (line.rfind("nonvoluntary_ctxt_switches:", 0) == 0)
        t.nvcsw = std::stod(line.substr(27));
      else if (line.rfind("voluntary_ctxt_switches:", 0) == 0)
        t.vcsw = std::stod(line.substr(24));
    out.push_back(t);
  }
  return out;
}

void print_thread_report(const std::vector<ThreadSample>& before, const std::vector<ThreadSample>& after, long main_tid,
                         int steps, int torch_threads) {
  auto earlier = [&](const ThreadSample& e) {
    for (auto& b : before)
      if (b.tid == e.tid) return b;
    return ThreadSample{};
  };
  double main_cpu = 0, other_cpu = 0, preempt = 0;
  for (auto& e : after) {
    ThreadSample b = earlier(e);
    (e.tid == main_tid ? main_cpu : other_cpu) += (e.cpu_ns - b.cpu_ns) / 1e6 / steps;
    if (e.tid == main_tid) preempt = (e.nvcsw - b.nvcsw) / steps;
  }
  std::printf("THREADS %.4f %.4f %.4f %d %d\n", main_cpu, other_cpu, preempt, static_cast<int>(after.size()),
              torch_threads);
  // By thread: CPU ms per step and sleeps (voluntary context switches) per step.
  std::printf("THREADDETAIL");
  for (auto& e : after) {
    ThreadSample b = earlier(e);
    std::printf(" %s%s:%.2fms/%.0f", e.name.c_str(), e.tid == main_tid ? "(main)" : "",
                (e.cpu_ns - b.cpu_ns) / 1e6 / steps, (e.vcsw - b.vcsw) / steps);
  }
  std::printf("\n");
}

}  // namespace dtrain::bench
