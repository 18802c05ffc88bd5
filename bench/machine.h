#pragma once
// What the whole machine is doing, for the benchmarks' "other load" columns.

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace dtrain::bench {

// CPU seconds all processes of the machine spent busy so far (/proc/stat);
// -1 when it cannot be read.
inline double machine_busy_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(f >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return -1;
  return static_cast<double>(user + nice + sys + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace dtrain::bench
