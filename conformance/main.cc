// dtrain-conformance: runs the conformance suite against one backend plugin.
//
//   dtrain-conformance --backend gloo --world-size 4     ranks as threads, in-memory store
//   dtrain --nproc_per_node 4 -- dtrain-conformance --backend gloo
//                                                        ranks as processes (rank, world
//                                                        size and store from the environment)
//   dtrain-conformance --backend ps_grpc --ps            the parameter-server suite: 1-3 servers
//                                                        x 1-3 workers as threads (ps_conformance.h)
//   dtrain-conformance --backend gloo --device cuda      the same cases on CUDA buffers; without a
//                                                        CUDA device: "skipped: ..." and exit 77
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "conformance.h"
#include "options.h"
#include "ps_conformance.h"
#include "threads.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/job.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/role_maker.h"
#include "dtrain/sdk/cuda_runtime.h"
#include "dtrain/store.h"

using namespace dtrain;

namespace {

constexpr int kSkipped = 77;  // CTest's SKIP_RETURN_CODE

// "cpu" -> -1; "cuda:N" -> N; "cuda" -> DTRAIN_DEVICE (the launcher's --gpus),
// else the local rank's device (0 for ranks as threads).
int parse_device(const std::string& d, int local_rank) {
  if (d == "cpu") return -1;
  if (d.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    long n = std::strtol(d.c_str() + 5, &end, 10);
    if (end != d.c_str() + 5 && *end == '\0' && n >= 0) return static_cast<int>(n);
  } else if (d == "cuda") {
    if (const char* e = std::getenv("DTRAIN_DEVICE"); e && *e)  // "3" or "cuda:3"
      return parse_device(std::string(e).rfind("cuda:", 0) == 0 ? e : "cuda:" + std::string(e), 0);
    int n = sdk::cuda::runtime().devices;
    return n > 0 ? local_rank % n : 0;
  }
  throw InvalidUsage("--device '" + d + "': use cpu, cuda or cuda:N");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain-conformance: checks a backend plugin against the dtrain communicator contract"};
  std::string backend;
  int world = 0;
  std::vector<std::string> plugin_dirs, options;
  conformance::Options o;
  int timeout_s = 120;
  app.add_option("--backend", backend, "backend plugin name (libdtrain_<name>.so)")->required();
  app.add_option("--world-size", world,
                 "run N ranks as threads of this process over an in-memory store; without it, the rank, world "
                 "size and store come from the environment (the dtrain launcher, Slurm, mpirun)");
  app.add_option("--plugin-path", plugin_dirs, "extra folder to search for plugins");
  app.add_option("--option", options, "backend option key=value (its TOML table), e.g. algorithm=ring");
  app.add_option("--large-count", o.large_count, "element count of the large cases")->capture_default_str();
  app.add_option("--filter", o.filter, "run only cases whose name contains this");
  auto* timeout_opt = app.add_option("--timeout-s", timeout_s,
                                     "deadline of each op in seconds; unset, it grows with the ranks per core")
                          ->capture_default_str();
  app.add_flag("-v,--verbose", o.verbose, "print every passing case");
  std::string device = "cpu";
  app.add_option("--device", device,
                 "where the cases' buffers live: cpu, cuda (the worker's device) or cuda:N; the expectations are "
                 "the same")
      ->capture_default_str();
  bool ps_suite = false;
  conformance::PsOptions po;
  app.add_flag("--ps", ps_suite,
               "run the parameter-server suite instead: servers and workers as threads of this process over an "
               "in-memory store, every table kind x optimizer rule x mode, save and load");
  app.add_option("--servers", po.servers, "--ps: server counts to run")->capture_default_str();
  app.add_option("--workers", po.workers, "--ps: worker counts to run")->capture_default_str();
  app.add_option("--scratch-dir", po.scratch_dir, "--ps: where the save/load cases write (default: the temp folder)");
  CLI11_PARSE(app, argc, argv);

  try {
    parse_device(device, 0);  // a bad --device is an error, with or without a GPU
    if (device != "cpu") {
      const auto& rt = sdk::cuda::runtime();
      if (!rt.usable()) {
        std::printf("dtrain-conformance: skipped: no CUDA device (%s)\n", rt.error.c_str());
        return kSkipped;
      }
      if (ps_suite) throw InvalidUsage("--device: the parameter-server suite runs on host buffers only");
    }
    PluginRegistry registry(plugin_dirs);
    auto be = registry.load(backend);
    RoleInfo role;
    if (world == 0 && !ps_suite) role = resolve_role();
    if (timeout_opt->count() == 0) {
      // An oversubscribed machine (32 ranks on 2 cores) runs each op that many
      // times slower; the default deadline follows (up to 10 minutes), and says so.
      int ranks = ps_suite ? 1 : world > 0 ? world : role.local_world_size;
      int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      int scaled = std::min(timeout_s * ((ranks + cores - 1) / cores), 600);
      if (scaled > timeout_s) {
        std::printf(
            "dtrain-conformance: %d ranks on %d cores here (oversubscribed): each op's deadline is %d s, "
            "not %d (--timeout-s sets it)\n",
            ranks, cores, scaled, timeout_s);
        timeout_s = scaled;
      }
    }
    CommOptions base;
    base.config_toml = conformance::options_to_toml(options);
    base.timeout = std::chrono::seconds(timeout_s);
    base.name = "conformance";

    std::vector<conformance::Result> results;
    auto t0 = std::chrono::steady_clock::now();
    if (ps_suite) {
      po.filter = o.filter;
      po.verbose = o.verbose;
      po.config_toml = base.config_toml;
      po.timeout = base.timeout;
      auto r = conformance::run_ps(be, po);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (auto& f : r.failures) std::fprintf(stderr, "FAIL %s\n", f.c_str());
      std::printf("parameter-server conformance of backend '%s' %s (servers and workers as threads), %.1f s\n",
                  be->name().c_str(), be->info().version.c_str(), secs);
      std::printf("%d passed, %d failed\n", r.passed, r.failed);
      return r.failed == 0 && r.passed > 0 ? 0 : 1;
    }
    if (world > 0) {
      base.store = std::make_shared<MemoryStore>();
      results.resize(world);
      o.cuda_device = parse_device(device, 0);
      auto run_rank = [&](int r, const std::shared_ptr<Communicator>& comm) {
        results[r] = conformance::run(*comm, o);
        // The failure cases, each on a fresh communicator of the same ranks.
        auto make_comm = [&](const std::string& name, std::chrono::milliseconds timeout) {
          CommOptions fo = base;
          fo.rank = fo.local_rank = r;
          fo.world_size = fo.local_world_size = world;
          fo.name = name;
          fo.timeout = timeout;
          return be->create_communicator(fo);
        };
        auto f = conformance::run_failures(*comm, make_comm, o);
        results[r].passed += f.passed;
        results[r].failed += f.failed;
        results[r].skipped += f.skipped;
        results[r].failures.insert(results[r].failures.end(), f.failures.begin(), f.failures.end());
      };
      auto errors = conformance::run_rank_threads(*be, base, world, run_rank);
      for (int r = 0; r < world; ++r) {
        if (errors[r].empty()) continue;
        results[r].failed++;
        results[r].failures.push_back("rank " + std::to_string(r) + ": " + errors[r]);
      }
    } else {
      JobOptions jo;
      jo.backend = backend;
      jo.config_toml = base.config_toml;
      jo.plugin_dirs = plugin_dirs;
      jo.timeout = base.timeout;
      jo.name = base.name;
      world = role.world_size;
      o.cuda_device = parse_device(device, role.local_rank);
      Job job = join_job(jo, role);
      auto& comm = job.comm;
      results.push_back(conformance::run(*comm, o));
      comm->barrier()->wait();
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    int passed = 0, failed = 0, skipped = 0;
    for (auto& r : results) {
      passed += r.passed;
      failed += r.failed;
      skipped += r.skipped;
      for (auto& f : r.failures) std::fprintf(stderr, "FAIL %s\n", f.c_str());
    }
    std::string on = o.cuda_device < 0 ? "" : ", CUDA buffers on cuda:" + std::to_string(o.cuda_device);
    std::printf("conformance of backend '%s' %s, %d rank%s%s%s, %.1f s\n", be->name().c_str(),
                be->info().version.c_str(), world, world == 1 ? "" : "s",
                results.size() == 1 && world > 1 ? " (this process is one of them)" : " (threads)", on.c_str(), secs);
    std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed == 0 && passed > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-conformance: %s\n", e.what());
    return 2;
  }
}
