// `dtrain-bench collectives`: the nccl-tests style table and its summary lines.
#include "collectives_internal.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/buffer.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/sdk/support.h"
#include "dtrain/store.h"
#include "dtrain/work.h"
#include "gloo_reference.h"
#include "options.h"  // sdk/testing: --option key=value as TOML
#include "process.h"

namespace dtrain::bench::coll {

namespace {

std::string fmt_time(std::optional<double> s) {
  if (!s) return "-";
  double us = *s * 1e6;
  return us < 1000 ? fmt::format("{:.2f}", us) : us < 1e6 ? fmt::format("{:.1f}", us) : fmt::format("{:.0f}", us);
}

std::string fmt_bw(std::optional<double> s, double bytes, double factor) {
  if (!s) return "-";
  return fmt::format("{:.3f}", bytes / *s / 1e9 * factor);
}

std::string fmt_ratio(std::optional<double> num_time, std::optional<double> den_time) {
  // busbw ratio = inverse time ratio (same bytes and factor)
  if (!num_time || !den_time) return "-";
  return fmt::format("{:.2f}", *den_time / *num_time);
}

}  // namespace

void print_table(const CollectivesOptions& o, const Plan& p, const std::vector<Row>& rows, bool gloo_on, bool mpi_on) {
  bool allreduce = p.op == Op::Allreduce;
  std::string title = o.aa ? "raw Gloo #2 (--aa)" : "dtrain (" + o.backend + ")";
  fmt::print("#\n");
  fmt::print("# {:>10} {:>10} {:>5} {:>5}  {:^32}  {:^18}  {:^18}  {:^13}  {:>8}\n", "", "", "", "",
             "--- " + title + " ---", gloo_on ? "--- raw Gloo ---" : "", mpi_on ? "--- Open MPI ---" : "",
             "busbw ratio", "latency");
  fmt::print("# {:>10} {:>10} {:>5} {:>5}  {:>10} {:>10} {:>10}  {:>10} {:>7}  {:>10} {:>7}  {:>6} {:>6}  {:>8}\n",
             "size(B)", "count", "type", "algo", "time(us)", "algbw", "busbw", "time(us)", "busbw", "time(us)", "busbw",
             "/gloo", "/mpi", "dt-gloo");
  fmt::print("# {:>10} {:>10} {:>5} {:>5}  {:>10} {:>10} {:>10}  {:>10} {:>7}  {:>10} {:>7}  {:>6} {:>6}  {:>8}\n", "",
             "", "", "", "", "(GB/s)", "(GB/s)", "", "(GB/s)", "", "(GB/s)", "", "", "(us)");
  for (auto& r : rows) {
    double bytes = static_cast<double>(r.c.bytes);
    std::string algo = allreduce && o.backend == "gloo"
                           ? gloo_allreduce_algorithm(p.gloo, p.world, r.c.count * dtype_size(p.dtype))
                           : "-";
    std::string dlat = "-";
    if (r.c.bytes <= kSmallBytes && r.paired(false)) dlat = fmt::format("{:+.1f}", *r.paired(false) * 1e6);
    std::string gloo_ratio = r.paired(true) ? fmt::format("{:.2f}", *r.paired(true)) : "-";
    fmt::print("  {:>10} {:>10} {:>5} {:>5}  {:>10} {:>10} {:>10}  {:>10} {:>7}  {:>10} {:>7}  {:>6} {:>6}  {:>8}\n",
               r.c.bytes, r.c.count, dtype_name(p.dtype), algo, fmt_time(r.dtrain), fmt_bw(r.dtrain, bytes, 1),
               fmt_bw(r.dtrain, bytes, p.busbw_factor), fmt_time(r.gloo), fmt_bw(r.gloo, bytes, p.busbw_factor),
               fmt_time(r.mpi), fmt_bw(r.mpi, bytes, p.busbw_factor), gloo_ratio, fmt_ratio(r.dtrain, r.mpi), dlat);
  }
  fmt::print("#\n");
  if (!gloo_on) return;
  // Summary against raw Gloo: busbw ratio from 1 MiB, latency difference up to
  // 64 KiB. Single rows carry this machine's scheduling noise (see --aa), so
  // the targets are judged on the figure over all rows of a range, with its
  // 95% confidence interval from the spread between rows.
  std::vector<double> log_ratio, dlat;
  double min_ratio = 1e9, max_dlat = -1e9;
  size_t at_min = 0, at_max = 0;
  for (auto& r : rows) {
    if (!r.paired(true)) continue;
    if (r.c.bytes >= kLargeBytes) {
      double q = *r.paired(true);
      if (q < min_ratio) min_ratio = q, at_min = r.c.bytes;
      log_ratio.push_back(std::log(q));
    }
    if (r.c.bytes <= kSmallBytes) {
      double d = *r.paired(false) * 1e6;
      if (d > max_dlat) max_dlat = d, at_max = r.c.bytes;
      dlat.push_back(d);
    }
  }
  // Mean and the half-width of its 95% interval (Student's t: a range has few rows).
  auto mean_ci = [](const std::vector<double>& v) {
    static const double t975[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                  2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086};
    double m = 0, ss = 0;
    for (double x : v) m += x;
    m /= v.size();
    for (double x : v) ss += (x - m) * (x - m);
    size_t df = v.size() - 1;
    double t = df == 0 ? 0 : df <= 20 ? t975[df - 1] : 1.96;
    double half = df ? t * std::sqrt(ss / df / v.size()) : 0;
    return std::make_pair(m, half);
  };
  // The targets are those of the gloo backend's all-reduce.
  bool targets = allreduce && o.backend == "gloo" && !o.aa;
  std::string who = o.aa ? "raw Gloo (2nd)" : "dtrain";
  if (!log_ratio.empty()) {
    auto [m, h] = mean_ci(log_ratio);
    fmt::print(
        "# {}/gloo busbw at >= 1 MiB: geometric mean {:.3f} (95% CI {:.3f}-{:.3f}), rows {:.3f} (at {}) .. {:.3f}{}\n",
        who, std::exp(m), std::exp(m - h), std::exp(m + h), min_ratio, human_bytes(at_min),
        std::exp(*std::max_element(log_ratio.begin(), log_ratio.end())),
        targets ? fmt::format("   [target >= 0.95: {}]", std::exp(m) >= 0.95 ? "met" : "NOT met") : "");
  }
  if (!dlat.empty()) {
    auto [m, h] = mean_ci(dlat);
    fmt::print(
        "# {}-gloo latency at <= 64 KiB: mean {:+.1f} us (95% CI {:+.1f} .. {:+.1f}), rows {:+.1f} .. {:+.1f} (at "
        "{}){}\n",
        who, m, m - h, m + h, *std::min_element(dlat.begin(), dlat.end()), max_dlat, human_bytes(at_max),
        targets ? fmt::format("   [target <= 10 us: {}]", m <= 10 ? "met" : "NOT met") : "");
  }
}

}  // namespace dtrain::bench::coll
