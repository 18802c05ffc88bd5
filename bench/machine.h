#pragma once
// What the whole machine is doing, for the benchmarks' "other load" columns,
// and what it can do: one core's memcpy bandwidth, the ceiling beside a table.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "stats.h"  // Clock, seconds_since

namespace dtrain::bench {

// A field of /proc/PID/status in MB ("VmRSS", "VmHWM"; pid "self"); 0 when absent.
inline double process_status_mb(const std::string& pid, const std::string& field) {
  std::ifstream in("/proc/" + pid + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  return 0;
}

// CPU seconds all processes of the machine spent busy so far (/proc/stat);
// -1 when it cannot be read.
inline double machine_busy_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(f >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return -1;
  return static_cast<double>(user + nice + sys + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// memcpy of 64 MiB on one core, best of 7, in GB/s: the machine's ceiling for
// moving bytes, measured in the same run as the figures it is printed beside.
inline double memcpy_gbs() {
  const size_t n = 64 << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 1e9;
  for (int i = 0; i < 7; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, seconds_since(t0));
    a[i] = b[n - 1 - i];
  }
  return static_cast<double>(n) / best / 1e9;
}

}  // namespace dtrain::bench
