// The nccl plugin through the core, on any machine. Without a visible CUDA
// device: it loads, names the NCCL and CUDA versions it runs on, and creating
// a communicator fails at once (never waiting for peers) with a message that
// says what to use instead. With one: a one-rank communicator all-reduces a
// CUDA buffer (the full suite on a GPU is docs/gpu.md's).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"
#include "work.h"  // plugins/nccl: poll_pause

using namespace dtrain;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

std::string nccl_version() {
  int v = 0;
  EXPECT_EQ(ncclGetVersion(&v), ncclSuccess);
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
}

int visible_gpus() {
  int n = 0;
  cudaError_t st = cudaGetDeviceCount(&n);
  cudaGetLastError();
  return st == cudaSuccess ? n : 0;
}

}  // namespace

TEST(NcclPlugin, LoadsAndNamesItsNcclAndCudaVersions) {
  auto b = PluginRegistry().load("nccl");
  const PluginInfo& info = b->info();
  EXPECT_EQ(info.name, "nccl");
  EXPECT_THAT(info.version, HasSubstr("NCCL " + nccl_version()));
  int rt = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&rt), cudaSuccess);
  std::string cuda = std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10);
  EXPECT_THAT(info.description, AllOf(HasSubstr("NCCL " + nccl_version()), HasSubstr("CUDA runtime " + cuda)));
  EXPECT_TRUE(b->supports(DT_CAP_CUDA_BUFFERS | DT_CAP_REDUCED_PRECISION | DT_CAP_ALLREDUCE | DT_CAP_ALLTOALL |
                          DT_CAP_SENDRECV | DT_CAP_BARRIER));
  EXPECT_FALSE(b->supports(DT_CAP_CPU_BUFFERS));
  // The newer entry points looked up at run time: named exactly when the loaded libnccl has them.
  for (const char* name : {"ncclAlltoAll", "ncclCommShrink", "ncclCommRevoke", "ncclCommRegister"}) {
    bool has = dlsym(RTLD_DEFAULT, name) != nullptr;
    EXPECT_EQ(info.description.find(name) != std::string::npos, has) << name << " in: " << info.description;
  }
  EXPECT_THAT(info.description, HasSubstr("; newer entry points: "));
}

// Two ranks, the second never started: without a GPU, rank 0 must not wait
// for it (or for anything): it fails in well under a second.
TEST(NcclPlugin, WithoutAGpuCreatingACommunicatorFailsAtOnce) {
  if (visible_gpus() > 0) {
    std::printf("NOT RUN: a CUDA device is visible, so the no-GPU failure cannot be checked here\n");
    GTEST_SKIP() << "a CUDA device is visible";
  }
  auto b = PluginRegistry().load("nccl");
  CommOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.store = std::make_shared<MemoryStore>();
  o.timeout = std::chrono::seconds(30);
  auto t0 = std::chrono::steady_clock::now();
  try {
    b->create_communicator(o);
    FAIL() << "created an nccl communicator without a GPU";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("nccl: no CUDA device is visible (cudaGetDeviceCount: "),
                                HasSubstr("use --backend gloo or --backend ucx on CPU-only machines")));
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 1000) << "comm_create took " << ms << " ms to fail";
}

TEST(NcclPlugin, OnAGpuOneRankAllReducesACudaBuffer) {
  if (visible_gpus() == 0) {
    std::printf("NOT RUN: no CUDA device is visible (the GPU half of this test runs on a GPU machine)\n");
    GTEST_SKIP() << "no CUDA device is visible";
  }
  auto b = PluginRegistry().load("nccl");
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto comm = b->create_communicator(o);
  const size_t n = 1000;
  std::vector<float> host(n, 2.5f);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  comm->allreduce(Buffer(dev, n, DType::F32, Device::cuda(0)))->wait();
  comm->barrier()->wait();
  ASSERT_EQ(cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dev);
  for (float x : host) ASSERT_EQ(x, 2.5f);
}

// wait() sees a completion at most ~1% of the op's time late: it spins for the
// first 5 ms (small and mid-size ops), then pauses 1% of the time waited so
// far, at most 1 ms (dtrain's per-op time against raw NCCL's: within 5%).
TEST(NcclPlugin, WaitPausesAtMostOnePercentOfTheTimeWaited) {
  using namespace std::chrono;
  using dtrain::nccl_backend::poll_pause;
  EXPECT_EQ(poll_pause(nanoseconds(0)).count(), 0);
  EXPECT_EQ(poll_pause(microseconds(300)).count(), 0);
  EXPECT_EQ(poll_pause(microseconds(4999)).count(), 0);
  for (auto waited : {milliseconds(5), milliseconds(7), milliseconds(20), milliseconds(99), milliseconds(100),
                      milliseconds(1000), milliseconds(600000)}) {
    auto p = poll_pause(waited);
    EXPECT_GT(p.count(), 0) << waited.count() << " ms";
    EXPECT_LE(p.count() * 100, duration_cast<microseconds>(waited).count()) << waited.count() << " ms";
    EXPECT_LE(p.count(), 1000) << waited.count() << " ms";
  }
  EXPECT_EQ(poll_pause(seconds(1)).count(), 1000);
}
