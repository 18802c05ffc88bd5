// dtrain-conformance: runs the conformance suite against one backend plugin.
//
//   dtrain-conformance --backend gloo --world-size 4     ranks as threads, in-memory store
//   dtrain --nproc_per_node 4 -- dtrain-conformance --backend gloo
//                                                        ranks as processes (rank, world
//                                                        size and store from the environment)
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>

#include "conformance.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/job.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/role_maker.h"
#include "dtrain/store.h"

using namespace dtrain;

namespace {

std::string flat_options(const std::vector<std::string>& kv) {
  std::string out;
  for (auto& s : kv) {
    auto eq = s.find('=');
    if (eq == std::string::npos) throw InvalidUsage("--option '" + s + "' is not key=value");
    std::string v = s.substr(eq + 1);
    bool literal = !v.empty() && (v[0] == '"' || v == "true" || v == "false" ||
                                  v.find_first_not_of("0123456789.-+_eE") == std::string::npos);
    out += s.substr(0, eq) + " = " + (literal ? v : "\"" + v + "\"") + "\n";
  }
  return out;
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
  app.add_option("--timeout-s", timeout_s, "deadline of each op in seconds")->capture_default_str();
  app.add_flag("-v,--verbose", o.verbose, "print every passing case");
  CLI11_PARSE(app, argc, argv);

  try {
    PluginRegistry registry(plugin_dirs);
    auto be = registry.load(backend);
    CommOptions base;
    base.config_toml = flat_options(options);
    base.timeout = std::chrono::seconds(timeout_s);
    base.name = "conformance";

    std::vector<conformance::Result> results;
    auto t0 = std::chrono::steady_clock::now();
    if (world > 0) {
      auto store = std::make_shared<MemoryStore>();
      results.resize(world);
      std::vector<std::thread> threads;
      std::mutex err_mu;
      std::string setup_error;
      for (int r = 0; r < world; ++r) {
        threads.emplace_back([&, r] {
          try {
            CommOptions co = base;
            co.rank = r;
            co.world_size = world;
            co.local_rank = r;
            co.local_world_size = world;
            co.store = store;
            auto comm = be->create_communicator(co);
            results[r] = conformance::run(*comm, o);
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lk(err_mu);
            results[r].failed++;
            results[r].failures.push_back("rank " + std::to_string(r) + ": " + e.what());
          }
        });
      }
      for (auto& t : threads) t.join();
    } else {
      JobOptions jo;
      jo.backend = backend;
      jo.config_toml = base.config_toml;
      jo.plugin_dirs = plugin_dirs;
      jo.timeout = base.timeout;
      jo.name = base.name;
      RoleInfo role = resolve_role();
      world = role.world_size;
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
    std::printf("conformance of backend '%s' %s, %d rank%s%s, %.1f s\n", be->name().c_str(),
                be->info().version.c_str(), world, world == 1 ? "" : "s",
                results.size() == 1 && world > 1 ? " (this process is one of them)" : " (threads)", secs);
    std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed == 0 && passed > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-conformance: %s\n", e.what());
    return 2;
  }
}
