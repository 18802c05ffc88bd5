// CUDA buffers on the CPU backends (sdk/cuda_staging.h) and the core's
// refusal of CUDA buffers for a backend without DT_CAP_CUDA_BUFFERS. The
// no-device cases run where no CUDA device is visible (this machine, CI) and
// report themselves skipped where one is; the GPU cases the other way round.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/sdk/cuda_runtime.h"
#include "dtrain/store.h"
#include "conformance.h"  // conformance/
#include "rank_threads.h"

using namespace dtrain;
using namespace std::chrono;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

namespace cuda = dtrain::sdk::cuda;

// The build tree's helper folders, or where the environment says (the GPU
// bundle's env.sh: the tests run there from another path).
std::string test_dir(const char* env, const char* built) {
  const char* e = std::getenv(env);
  return e && *e ? e : built;
}

#define REQUIRE_NO_GPU() \
  if (cuda::runtime().usable()) GTEST_SKIP() << "a CUDA device is visible: the GPU cases below run instead"
#define REQUIRE_GPU() \
  if (!cuda::runtime().usable()) GTEST_SKIP() << "skipped: no CUDA device (" << cuda::runtime().error << ")"

class StagingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string file =
        test_dir("DTRAIN_BUILT_PLUGIN_DIR", DTRAIN_BUILT_PLUGIN_DIR) + "/libdtrain_" + GetParam() + ".so";
    if (access(file.c_str(), F_OK) != 0) GTEST_SKIP() << "the " << GetParam() << " plugin was not built";
  }
};

// Device memory for the GPU cases, through the same run-time loaded runtime.
struct DeviceFloats {
  void* ptr = nullptr;
  size_t n;
  explicit DeviceFloats(const std::vector<float>& host) : n(host.size()) {
    const auto& rt = cuda::runtime();
    rt.check(rt.Malloc(&ptr, n * sizeof(float)), "cudaMalloc");
    rt.check(rt.Memcpy(ptr, host.data(), n * sizeof(float), cuda::kMemcpyHostToDevice), "cudaMemcpy");
  }
  ~DeviceFloats() { cuda::runtime().Free(ptr); }
  std::vector<float> get() const {
    std::vector<float> v(n);
    const auto& rt = cuda::runtime();
    rt.check(rt.Memcpy(v.data(), ptr, n * sizeof(float), cuda::kMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }
  Buffer buf() const { return Buffer(ptr, n, DType::F32, Device::cuda(0)); }
};

}  // namespace

TEST(CudaRuntime, LoaderReportsWhyNoDeviceIsVisible) {
  REQUIRE_NO_GPU();
  const auto& rt = cuda::runtime();
  EXPECT_EQ(rt.devices, 0);
  EXPECT_FALSE(rt.error.empty());
  // This image has libcudart.so.13 and no driver: the runtime loads and
  // cudaGetDeviceCount says why; without the library the message names it.
  if (!rt.library.empty())
    EXPECT_THAT(rt.error, HasSubstr("cudaGetDeviceCount: "));
  else
    EXPECT_THAT(rt.error, HasSubstr("no CUDA runtime library could be loaded (libcudart.so.13"));
  try {
    cuda::require_device(0);
    ADD_FAILURE() << "require_device(0) succeeded without a device";
  } catch (const dtrain::sdk::Error& e) {
    EXPECT_EQ(e.status(), DT_ERR_NOT_SUPPORTED);
    EXPECT_THAT(e.what(), HasSubstr("buffer on cuda:0 but no CUDA device is visible: " + rt.error));
  }
}

TEST_P(StagingTest, CudaBufferFailsTheOpAtOnceAndTheCommunicatorStaysUsable) {
  REQUIRE_NO_GPU();
  dtrain::test::run_rank_threads(GetParam(), 2, seconds(20), [&](int r, const std::shared_ptr<Communicator>& c) {
    EXPECT_TRUE(c->backend()->supports(DT_CAP_CUDA_BUFFERS));
    std::vector<float> a(8, 1.0f);  // never touched: the op fails before any copy
    auto t0 = steady_clock::now();
    try {
      c->allreduce(Buffer(a.data(), a.size(), DType::F32, Device::cuda(0)))->wait();
      ADD_FAILURE() << "rank " << r << ": an all-reduce on cuda:0 succeeded without a CUDA device";
    } catch (const NotSupported& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr("backend '" + GetParam() + "'"),
                                  HasSubstr("buffer on cuda:0 but no CUDA device is visible: ")));
    }
    try {
      std::vector<float> out(16);
      c->allgather(Buffer::of(a.data(), a.size()), Buffer(out.data(), out.size(), DType::F32, Device::cuda(1)))->wait();
      ADD_FAILURE() << "an all-gather into cuda:1 succeeded without a CUDA device";
    } catch (const NotSupported& e) {
      EXPECT_THAT(e.what(), HasSubstr("buffer on cuda:1 but no CUDA device is visible"));
    }
    EXPECT_LT(duration<double>(steady_clock::now() - t0).count(), 5.0) << "the refusal must not wait for peers";
    EXPECT_FALSE(c->is_poisoned()) << "a refused op must not poison the communicator";
    std::vector<float> v(1001, static_cast<float>(r + 1));
    c->allreduce(Buffer::of(v.data(), v.size()))->wait();
    EXPECT_EQ(v[0], 3.0f);
    EXPECT_EQ(v[1000], 3.0f);
  });
}

TEST(CoreCaps, CudaBufferOnABackendWithoutTheCapIsRefusedAsC10dDoes) {
  PluginRegistry reg({test_dir("DTRAIN_BAD_PLUGIN_DIR", DTRAIN_BAD_PLUGIN_DIR)});
  auto be = reg.load("v10");  // caps: allreduce cpu
  ASSERT_FALSE(be->supports(DT_CAP_CUDA_BUFFERS));
  CommOptions o;
  o.store = std::make_shared<MemoryStore>();
  auto c = be->create_communicator(o);
  std::vector<float> a(4, 1.0f);
  try {
    c->allreduce(Buffer(a.data(), a.size(), DType::F32, Device::cuda(0)));
    ADD_FAILURE() << "a CUDA buffer reached a backend without the cuda capability";
  } catch (const NotSupported& e) {
    EXPECT_THAT(e.what(), HasSubstr("backend 'v10' does not support CUDA buffers (allreduce: send buffer on cuda:0)"));
  }
  EXPECT_FALSE(c->is_poisoned());
  c->allreduce(Buffer::of(a.data(), a.size()))->wait();
  EXPECT_EQ(a[3], 1.0f);
}

// With a GPU: two ranks all-reduce, broadcast and send/recv CUDA buffers
// through the staging, and the pinned pool is reused.
TEST_P(StagingTest, CudaBuffersRoundTripThroughPinnedHostMemory) {
  REQUIRE_GPU();
  dtrain::test::run_rank_threads(GetParam(), 2, seconds(60), [&](int r, const std::shared_ptr<Communicator>& c) {
    for (size_t n : {size_t{1}, size_t{1001}, size_t{1} << 20}) {
      DeviceFloats d(std::vector<float>(n, static_cast<float>(r + 1)));
      c->allreduce(d.buf())->wait();
      auto v = d.get();
      EXPECT_EQ(v[0], 3.0f) << "n=" << n;
      EXPECT_EQ(v[n - 1], 3.0f) << "n=" << n;
      DeviceFloats b(std::vector<float>(n, r == 1 ? 7.0f : 0.0f));
      c->broadcast(b.buf(), 1)->wait();
      EXPECT_EQ(b.get()[n - 1], 7.0f);
      DeviceFloats p(std::vector<float>(n, static_cast<float>(10 + r)));
      if (r == 0) {
        c->send(p.buf(), 1, 3)->wait();
      } else {
        c->recv(p.buf(), 0, 3)->wait();
        EXPECT_EQ(p.get()[n - 1], 10.0f);
      }
    }
  });
}

// With a GPU: the conformance suite's cases on CUDA buffers (the same as
// `dtrain-conformance --backend <b> --world-size 2 --device cuda`, smaller).
TEST_P(StagingTest, ConformanceCasesOnCudaBuffers) {
  REQUIRE_GPU();
  conformance::Options o;
  o.cuda_device = 0;
  o.large_count = 65537;
  dtrain::test::run_rank_threads(GetParam(), 2, seconds(60), [&](int, const std::shared_ptr<Communicator>& c) {
    auto r = conformance::run(*c, o);
    EXPECT_GT(r.passed, 0);
    EXPECT_EQ(r.failed, 0) << (r.failures.empty() ? "" : r.failures[0]);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, StagingTest, ::testing::Values("gloo", "ucx"),
                         [](const auto& info) { return info.param; });
