// The CPU backends' CUDA staging (sdk/cuda_staging.h) end to end without a
// GPU: DTRAIN_CUDART points the run-time loaded runtime, in this process and
// in the plugins, at tests/tools/fake_cudart.c (one "device" in host memory
// whose asynchronous copies land only when synchronized). A staging that
// reads its copy too early or completes before its copy back sees stale
// bytes here. The same cases on a real GPU: cuda_staging_test.
#include <dlfcn.h>
#include <stdlib.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "conformance.h"  // conformance/
#include "dtrain/communicator.h"
#include "dtrain/sdk/cuda_runtime.h"
#include "rank_threads.h"

using namespace dtrain;
using namespace std::chrono;

namespace {

namespace cuda = dtrain::sdk::cuda;

// The build tree's helper folders, or where the environment says (the GPU
// bundle's env.sh: the tests run there from another path).
std::string test_dir(const char* env, const char* built) {
  const char* e = std::getenv(env);
  return e && *e ? e : built;
}

const std::string kFake = test_dir("DTRAIN_BAD_PLUGIN_DIR", DTRAIN_BAD_PLUGIN_DIR) + "/libfake_cudart.so";
// Before main: every runtime() of the process (ours, the plugins') loads the fake.
const bool kEnvSet = setenv("DTRAIN_CUDART", kFake.c_str(), 1) == 0;

long fake_counter(const char* name) {
  void* h = dlopen(kFake.c_str(), RTLD_NOW | RTLD_NOLOAD);
  auto fn = h ? reinterpret_cast<long (*)()>(dlsym(h, name)) : nullptr;
  return fn ? fn() : -1;
}
long host_allocs() { return fake_counter("fake_cuda_host_allocs"); }

class FakeCudaTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kEnvSet);
    ASSERT_TRUE(cuda::runtime().usable()) << cuda::runtime().error;
    ASSERT_EQ(cuda::runtime().library, kFake);
  }
};

}  // namespace

TEST_P(FakeCudaTest, ConformanceCasesOnCudaBuffers) {
  conformance::Options o;
  o.cuda_device = 0;
  o.large_count = 65537;
  dtrain::test::run_rank_threads(GetParam(), 2, seconds(60), [&](int, const std::shared_ptr<Communicator>& c) {
    auto r = conformance::run(*c, o);
    EXPECT_GT(r.passed, 500);
    EXPECT_EQ(r.failed, 0) << (r.failures.empty() ? "" : r.failures[0]);
  });
}

TEST_P(FakeCudaTest, PinnedBuffersArePooledPerCommunicator) {
  dtrain::test::run_rank_threads(GetParam(), 2, seconds(60), [&](int r, const std::shared_ptr<Communicator>& c) {
    void* d = nullptr;
    const auto& rt = cuda::runtime();
    rt.check(rt.Malloc(&d, 4096 * sizeof(float)), "cudaMalloc");
    c->barrier()->wait();
    long before = host_allocs();
    for (int i = 0; i < 40; ++i) {
      std::vector<float> v(4096, static_cast<float>(r + i));
      rt.check(rt.Memcpy(d, v.data(), v.size() * sizeof(float), cuda::kMemcpyHostToDevice), "cudaMemcpy");
      c->allreduce(Buffer(d, v.size(), DType::F32, Device::cuda(0)))->wait();
      rt.check(rt.Memcpy(v.data(), d, v.size() * sizeof(float), cuda::kMemcpyDeviceToHost), "cudaMemcpy");
      ASSERT_EQ(v[4095], static_cast<float>(1 + 2 * i)) << "step " << i;
    }
    c->barrier()->wait();
    // One block per rank (the first op); never one per op.
    EXPECT_LE(host_allocs() - before, 2);
    rt.Free(d);
  });
}

// One rank, so no other rank's copies are in flight: when wait() returns, or
// the work reports completion to a poller, the copy back has landed.
TEST_P(FakeCudaTest, WorkCompletesOnlyAfterTheCopyBack) {
  dtrain::test::run_rank_threads(GetParam(), 1, seconds(20), [&](int, const std::shared_ptr<Communicator>& c) {
    void* d = nullptr;
    const auto& rt = cuda::runtime();
    rt.check(rt.Malloc(&d, 1000 * sizeof(float)), "cudaMalloc");
    for (int polled = 0; polled < 2; ++polled) {
      auto w = c->allreduce(Buffer(d, 1000, DType::F32, Device::cuda(0)), ReduceOp::Sum);
      if (polled)
        while (!w->is_completed()) std::this_thread::sleep_for(milliseconds(1));
      else
        w->wait();
      EXPECT_EQ(fake_counter("fake_cuda_pending"), 0) << (polled ? "polled" : "waited");
    }
    // A blocking call returns after the copy back too (a staged op never runs
    // inside its call: the copy back completes with the host op's work).
    CallOptions blocking;
    blocking.blocking = true;
    auto w = c->allreduce(Buffer(d, 1000, DType::F32, Device::cuda(0)), ReduceOp::Sum, blocking);
    EXPECT_TRUE(w->is_success());
    EXPECT_EQ(fake_counter("fake_cuda_pending"), 0) << "blocking";
    rt.Free(d);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, FakeCudaTest, ::testing::Values("gloo", "ucx"),
                         [](const auto& info) { return info.param; });
