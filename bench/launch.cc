// dtrain-bench launch: the launcher at 2, 8 and 32 ranks on this machine. For
// each backend and size it runs `dtrain --nproc_per_node N` on this program's
// probe, which joins the job as every app does (resolve_role + join_job) and
// runs one all-reduce; the table gives the time from starting `dtrain` to the
// last rank's first all-reduce done, and each rank's peak resident memory.
//
//   dtrain-bench launch --ranks 2,8,32 --backends gloo,ucx --trials 3

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/job.h"
#include "machine.h"
#include "process.h"
#include "stats.h"

namespace dtrain::bench::launch {
namespace {

// One rank: join, one all-reduce, its figures in OUT/probe.<rank>.
int probe(const std::string& out) {
  RoleInfo role = resolve_role();
  JobOptions jo;
  jo.backend = std::getenv("DTRAIN_BACKEND") ? std::getenv("DTRAIN_BACKEND") : "gloo";
  Job job = join_job(jo, role);
  float x = 1;
  job.comm->allreduce(Buffer(&x, 1, DType::F32))->wait();
  int64_t done = now_ns();
  if (x != static_cast<float>(job.comm->size())) throw InvalidUsage(fmt::format("all-reduce gave {}", x));
  std::ofstream(out + "/probe." + std::to_string(role.rank))
      << done << " " << process_status_mb("self", "VmHWM") << "\n";
  job.comm->barrier()->wait();
  return 0;
}

struct Options {
  std::vector<int> ranks{2, 8, 32};
  std::vector<std::string> backends{"gloo", "ucx"};
  int trials = 3;
  int limit_s = 300;
};

struct Run {
  double first_s = 0;
  std::vector<double> mb;
  std::string failure;
};

Run run_once(const std::string& backend, int n, const Options& o) {
  std::string dir =
      std::filesystem::temp_directory_path() / fmt::format("dtrain-bench-launch.{}.{}.{}", getpid(), backend, n);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string dtrain = dir_of(self_exe()) + "/dtrain";
  Run r;
  int64_t t0 = now_ns();
  auto c = run_capture(dtrain,
                       {dtrain, "--nproc_per_node", std::to_string(n), "--backend", backend, "--log_dir", dir + "/log",
                        self_exe(), "--probe", dir},
                       {"DTRAIN_LOG_LEVEL=warn"}, std::chrono::seconds(o.limit_s));
  int64_t last = 0;
  for (int rank = 0; rank < n; ++rank) {
    std::ifstream in(dir + "/probe." + std::to_string(rank));
    long long t = 0;
    double mb = 0;
    if (!(in >> t >> mb)) {
      if (c.failure.empty()) c.failure = fmt::format("rank {} wrote no figures", rank);
      break;
    }
    last = std::max<int64_t>(last, t);
    r.mb.push_back(mb);
  }
  r.first_s = double(last - t0) / 1e9;
  if (c.failure.empty()) {
    std::filesystem::remove_all(dir);
  } else {
    r.failure = c.failure + " (the workers' logs are in " + dir + "/log)";
  }
  return r;
}

int run_parent(const Options& o) {
  install_interrupt_handlers();
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf(
      "dtrain-bench launch: `dtrain --nproc_per_node N` on this machine (%u cores), each rank joining the\n"
      "job and running one all-reduce; %d trial(s), medians (min-max).\n\n",
      cores, o.trials);
  std::printf(
      "| backend | ranks | ranks per core | launch to first all-reduce s | memory per rank MB (median) | "
      "memory per rank MB (max) |\n|---|---|---|---|---|---|\n");
  bool ok = true;
  for (const auto& backend : o.backends)
    for (int n : o.ranks) {
      std::vector<double> first, med, max;
      std::string failure;
      for (int t = 0; t < o.trials && !interrupted(); ++t) {
        Run r = run_once(backend, n, o);
        if (!r.failure.empty()) {
          failure = r.failure;
          ok = false;
          continue;
        }
        first.push_back(r.first_s);
        std::sort(r.mb.begin(), r.mb.end());
        med.push_back(median(r.mb));
        max.push_back(r.mb.back());
      }
      if (first.empty()) {
        std::printf("| %s | %d | %.1f | failed: %s | | |\n", backend.c_str(), n, double(n) / cores, failure.c_str());
      } else {
        std::printf("| %s | %d | %.1f | %s | %s | %s |\n", backend.c_str(), n, double(n) / cores,
                    median_range(first, 2).c_str(), median_range(med, 1).c_str(), median_range(max, 1).c_str());
        if (!failure.empty()) std::printf("|  |  |  | a trial failed: %s | | |\n", failure.c_str());
      }
      std::fflush(stdout);
    }
  std::printf(
      "\nmemory: each rank's peak resident size (VmHWM) after its first all-reduce: the core, the plugin\n"
      "and its connections to the other ranks.\n");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace dtrain::bench::launch

int main(int argc, char** argv) {
  using namespace dtrain::bench::launch;
  CLI::App app{"dtrain-bench launch: the launcher at 2-32 ranks: time to the first all-reduce, memory per rank"};
  Options o;
  std::string probe_dir;
  app.add_option("--ranks", o.ranks, "processes per run")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--backends", o.backends, "plugins to run")->delimiter(',');
  app.add_option("--trials", o.trials, "runs per size")->check(CLI::Range(1, 100));
  app.add_option("--limit", o.limit_s, "seconds one run may take")->check(CLI::Range(5, 3600));
  app.add_option("--probe", probe_dir, "(internal) run as one rank, writing its figures in this folder");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!probe_dir.empty()) return probe(probe_dir);
    return run_parent(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-bench launch: %s\n", e.what());
    return 1;
  }
}
