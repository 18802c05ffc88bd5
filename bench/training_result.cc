#include "training_result.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "stats.h"

namespace dtrain::bench {

Result parse_ranks(const std::vector<std::string>& texts, const std::string& impl, int world) {
  Result r;
  const std::string& text = texts[0];
  size_t p = text.find("RESULT ");
  if (p == std::string::npos ||
      std::sscanf(text.c_str() + p, "RESULT %lf %lf %lf", &r.ips, &r.step_ms, &r.comm_ms) != 3)
    throw std::runtime_error("no result from " + impl + ": " + text);
  std::vector<std::vector<int64_t>> ends;
  for (const auto& t : texts) {
    double f = 0, b = 0, s = 0, o = 0, mc = 0, oc = 0, pr = 0;
    int nt = 0, it = 0;
    size_t q = t.find("PHASES ");
    if (q != std::string::npos && std::sscanf(t.c_str() + q, "PHASES %lf %lf %lf %lf", &f, &b, &s, &o) == 4) {
      r.fwd_ms += f / world, r.bwd_ms += b / world, r.sync_ms += s / world, r.opt_ms += o / world;
    }
    q = t.find("THREADS ");
    if (q != std::string::npos &&
        std::sscanf(t.c_str() + q, "THREADS %lf %lf %lf %d %d", &mc, &oc, &pr, &nt, &it) == 5) {
      r.main_cpu_ms += mc / world, r.other_cpu_ms += oc / world, r.preempt += pr / world;
      r.threads = nt;
    }
    q = t.find("BWDEND");
    ends.emplace_back();
    if (q != std::string::npos) {
      std::istringstream is(t.substr(q + 6, t.find('\n', q) - q - 6));
      long long v;
      while (is >> v) ends.back().push_back(v);
    }
  }
  if (size_t q = texts[0].find("THREADDETAIL "); q != std::string::npos)
    r.rank0_threads = texts[0].substr(q + 13, texts[0].find('\n', q) - q - 13);
  // Meaningless where the ranks run free (the ceiling) or wait inside backward (c10d).
  if ((impl == "dtrain" || impl == "lockstep") && world == 2 && ends[0].size() == ends[1].size() && !ends[0].empty()) {
    std::vector<double> gaps;
    for (size_t i = 0; i < ends[0].size(); ++i) gaps.push_back(std::abs(double(ends[0][i] - ends[1][i])) / 1e6);
    r.skew_ms = median(gaps);
  }
  return r;
}

}  // namespace dtrain::bench
