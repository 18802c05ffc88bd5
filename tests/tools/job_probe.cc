// dtrain-job-probe: a small job for the launcher tests. It joins the job the
// way every app does (resolve_role + join_job), runs an all-reduce loop and
// checks every result.
//
//   dtrain --nproc_per_node 4 -- dtrain-job-probe --backend gloo --iterations 1000
//
// Started as a parameter server (dtrain --server_num), it plays the launcher's
// side of a server without a PS backend: it waits for the job store's root key
// ps/stop, then exits with --server-exit-code (or never, --server-ignore-stop).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "dtrain/communicator.h"
#include "dtrain/endpoint.h"
#include "dtrain/job.h"
#include "dtrain/store.h"

using namespace dtrain;

int main(int argc, char** argv) {
  CLI::App app{"dtrain-job-probe: all-reduce loop for launcher tests"};
  std::string backend = "gloo", tag;
  int iterations = 10, fail_rank = -1, exit_code = 3;
  double sleep_ms = 0, timeout_s = 60;
  app.add_option("--backend", backend);
  app.add_option("--iterations", iterations);
  app.add_option("--sleep-ms", sleep_ms, "pause between iterations");
  app.add_option("--timeout-s", timeout_s);
  app.add_option("--fail-first-attempt-rank", fail_rank, "this rank exits with --exit-code on attempt 0");
  app.add_option("--exit-code", exit_code);
  app.add_option("--tag", tag, "ignored; lets a test find its processes");
  int server_exit_code = 0;
  bool server_ignore_stop = false;
  app.add_option("--server-exit-code", server_exit_code, "a server's exit code after ps/stop");
  app.add_flag("--server-ignore-stop", server_ignore_stop, "a server never exits on its own");
  CLI11_PARSE(app, argc, argv);
  try {
    RoleInfo role = resolve_role();
    if (role.role == Role::Server) {
      std::printf("probe server %d pid %d restart_count %d\n", role.server_index, getpid(), role.restart_count);
      std::fflush(stdout);
      auto [host, port] = parse_host_port(role.store_endpoint);
      TcpStore store(host, port, role.job_token, std::chrono::seconds(30));
      for (;;) {
        if (auto v = store.try_get("ps/stop"); v && !server_ignore_stop) {
          std::printf("probe server %d: ps/stop = %s; exiting with %d\n", role.server_index,
                      std::string(v->begin(), v->end()).c_str(), server_exit_code);
          return server_exit_code;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    std::printf("probe rank %d/%d pid %d restart_count %d\n", role.rank, role.world_size, getpid(), role.restart_count);
    std::fflush(stdout);
    JobOptions jo;
    jo.backend = backend;
    jo.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    Job job = join_job(jo, role);
    Communicator& comm = *job.comm;
    std::vector<float> v(1024);
    for (int it = 0; it < iterations; ++it) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(comm.rank() + it);
      comm.allreduce(Buffer(v.data(), v.size(), DType::F32))->wait();
      float n = static_cast<float>(comm.size());
      float want = n * (n - 1) / 2 + n * static_cast<float>(it);
      for (float x : v)
        if (x != want) {
          std::fprintf(stderr, "iteration %d: got %g, want %g\n", it, x, want);
          return 1;
        }
      if (it == 0) {
        std::printf("probe rank %d: first all-reduce done\n", comm.rank());
        std::fflush(stdout);
        if (comm.rank() == fail_rank && role.restart_count == 0) {
          std::fprintf(stderr, "probe rank %d: failing on purpose on the first attempt\n", comm.rank());
          return exit_code;
        }
      }
      if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(sleep_ms * 1000)));
    }
    comm.barrier()->wait();
    std::printf("probe rank %d: %d iterations ok\n", comm.rank(), iterations);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-job-probe: %s\n", e.what());
    return 1;
  }
}
