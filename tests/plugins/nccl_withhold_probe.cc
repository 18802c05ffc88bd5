// dtrain-nccl-withhold-probe: a job on --backend nccl in which one rank
// withholds a collective (tests/launcher/nccl_withhold.sh). Every rank
// all-reduces a CUDA buffer once and checks the sum; then the withholding rank
// sleeps instead of the second all-reduce, and every other rank runs it with an
// op timeout and prints how long it took to fail and the error, which must
// name the missing rank. Exit codes: 1 the expected timeout (an error, so the
// launcher stops the job), 3 the withholding rank was never stopped, 4 the op
// completed without it, 2 anything else, 77 no CUDA device (skipped).
// --backend gloo --cpu runs the same on host buffers, where no GPU is needed
// (the test's own check of the script, the probe and the launcher's part).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/job.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;

namespace {

void check(cudaError_t st, const char* what) {
  if (st != cudaSuccess) throw IoError(std::string(what) + ": " + cudaGetErrorString(st));
}

// The device the nccl plugin picks: DTRAIN_DEVICE ("3" or "cuda:3"), else the local rank.
int device_of(const RoleInfo& role, int visible) {
  if (const char* e = std::getenv("DTRAIN_DEVICE"); e && *e) {
    const char* colon = std::strrchr(e, ':');
    return std::atoi(colon ? colon + 1 : e);
  }
  return role.local_rank % visible;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain-nccl-withhold-probe: one rank of an nccl job withholds a collective"};
  int withhold = 1;
  int64_t timeout_ms = 3000;
  double init_timeout_s = 120, hold_s = 120;
  std::string tag, backend = "nccl";
  bool cpu = false;
  app.add_option("--backend", backend, "the job's backend")->capture_default_str();
  app.add_flag("--cpu", cpu, "host buffers instead of CUDA ones (for a CPU backend)");
  app.add_option("--withhold-rank", withhold, "the rank that skips the second all-reduce")->capture_default_str();
  app.add_option("--timeout-ms", timeout_ms, "the second all-reduce's op timeout")->capture_default_str();
  app.add_option("--init-timeout-s", init_timeout_s, "the communicator's timeout (init, first op)");
  app.add_option("--hold-s", hold_s, "how long the withholding rank sleeps before exiting by itself (code 3)");
  app.add_option("--tag", tag, "ignored; lets a test find its processes");
  CLI11_PARSE(app, argc, argv);
  int visible = 0;
  cudaError_t st = cpu ? cudaSuccess : cudaGetDeviceCount(&visible);
  if (!cpu && (st != cudaSuccess || visible <= 0)) {
    std::printf("dtrain-nccl-withhold-probe: skipped: no CUDA device (%s)\n",
                st != cudaSuccess ? cudaGetErrorString(st) : "0 devices");
    return 77;
  }
  int rank = -1;
  try {
    RoleInfo role = resolve_role();
    rank = role.rank;
    JobOptions jo;
    jo.backend = backend;
    jo.timeout = std::chrono::milliseconds(static_cast<int64_t>(init_timeout_s * 1000));
    Job job = join_job(jo, role);
    Communicator& comm = *job.comm;
    const size_t n = 1024;
    std::vector<float> h(n, 1.0f);
    // Host buffers with --cpu; they outlive the communicator (a transport past
    // its timeout may still touch them).
    static std::vector<float> host(n, 1.0f);
    int dev = -1;
    float* d = host.data();
    if (!cpu) {
      dev = device_of(role, visible);
      check(cudaSetDevice(dev), "cudaSetDevice");
      check(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(float)), "cudaMalloc");
      check(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    Buffer buf = cpu ? Buffer(d, n, DType::F32) : Buffer(d, n, DType::F32, Device::cuda(dev));
    comm.allreduce(buf)->wait();
    if (cpu)
      h = host;
    else
      check(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (float x : h)
      if (x != static_cast<float>(comm.size())) {
        std::fprintf(stderr, "probe rank %d: first all-reduce gave %g, not %d\n", rank, x, comm.size());
        return 2;
      }
    std::printf("probe rank %d/%d on %s: first all-reduce done\n", rank, comm.size(),
                cpu ? "the CPU" : ("cuda:" + std::to_string(dev)).c_str());
    std::fflush(stdout);
    if (rank == withhold) {
      std::printf("probe rank %d: withholding all-reduce #2\n", rank);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(hold_s * 1000)));
      std::printf("probe rank %d: never stopped; exiting\n", rank);
      return 3;
    }
    auto t0 = Clock::now();
    try {
      CallOptions o;
      o.timeout = std::chrono::milliseconds(timeout_ms);
      comm.allreduce(buf, ReduceOp::Sum, o)->wait();
    } catch (const Error& e) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      std::printf("probe rank %d: %s after %lld ms: %s\n", rank, to_string(e.kind()), static_cast<long long>(ms),
                  e.what());
      std::fflush(stdout);
      return 1;
    }
    std::printf("probe rank %d: all-reduce #2 completed without rank %d\n", rank, withhold);
    return 4;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-nccl-withhold-probe: rank %d: %s\n", rank, e.what());
    return 2;
  }
}
