#include <chrono>
#include <cstdlib>
#include <fstream>
#include <list>
#include <mutex>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"
#include "rank_threads.h"

using namespace dtrain;
using namespace std::chrono;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

template <typename F>
void run_ranks(const std::string& backend, int world, milliseconds timeout, F fn) {
  dtrain::test::run_rank_threads(backend, world, timeout,
                                 [&](int r, const std::shared_ptr<Communicator>& comm) { fn(r, *comm); });
}

// The backends these tests name; one this build left out (DTRAIN_WITH_<NAME>=OFF,
// or its library missing) is skipped, not failed.
class CommunicatorTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string file = std::string(DTRAIN_BUILT_PLUGIN_DIR) + "/libdtrain_" + GetParam() + ".so";
    if (access(file.c_str(), F_OK) != 0)
      GTEST_SKIP() << "the " << GetParam() << " plugin was not built (" << file << ")";
  }
};

// Buffers of ones per rank that outlive the test and the process (see
// WithheldRankTimesOutNamingItAndPoisons): a fresh set per call, so no
// instance of a test shares memory with a transport still finishing a former one.
std::vector<std::vector<float>>* lasting_buffers(int ranks, size_t count) {
  static std::mutex mu;
  static auto* sets = new std::list<std::vector<std::vector<float>>>();
  std::lock_guard<std::mutex> lock(mu);
  return &sets->emplace_back(ranks, std::vector<float>(count, 1.0f));
}

// Two ranks, rank 1 away for `absent` and then gone: rank 0 runs body with
// `count` ones in a buffer that outlives the communicator (work.h).
template <typename F>
void with_absent_peer(const std::string& backend, size_t count, milliseconds absent, F body) {
  auto* buffers = lasting_buffers(1, count);
  run_ranks(backend, 2, seconds(30), [&](int r, Communicator& comm) {
    if (r == 1) {
      std::this_thread::sleep_for(absent);
      return;
    }
    body(comm, (*buffers)[0]);
  });
}

}  // namespace

TEST_P(CommunicatorTest, WithheldRankTimesOutNamingItAndPoisons) {
  const auto timeout = milliseconds(1500);
  std::atomic<int> done{0};
  // A failed op's buffers may still be touched by a transport that cannot be
  // interrupted (Gloo) until its own timeout, even after the communicator is
  // gone (work.h): they outlive the test, and the process's exit too (a
  // static would be destroyed at exit while a Gloo pair thread may still
  // write from it; TSan saw that once), and each instance of the test has its own.
  auto* buffers = lasting_buffers(3, 1024);
  run_ranks(GetParam(), 3, seconds(30), [&](int r, Communicator& comm) {
    std::vector<float>& v = (*buffers)[r];
    comm.allreduce(Buffer::of(v.data(), v.size()))->wait();  // everyone arrives once
    if (r == 2) {
      // Rank 2 withholds the second collective until the others gave up.
      while (done.load() < 2) std::this_thread::sleep_for(milliseconds(10));
      return;
    }
    auto t0 = steady_clock::now();
    try {
      comm.allreduce(Buffer::of(v.data(), v.size()), ReduceOp::Sum, CallOptions{timeout})->wait();
      ADD_FAILURE() << "rank " << r << ": allreduce completed without rank 2";
    } catch (const TimeoutError& e) {
      auto took = duration_cast<milliseconds>(steady_clock::now() - t0);
      // Not early; late only by scheduling (a loaded CI machine), far from the 30 s
      // the op would take without the timeout.
      EXPECT_GE(took.count(), timeout.count() - 50);
      EXPECT_LE(took.count(), timeout.count() + 8000) << e.what();
      EXPECT_THAT(e.what(), AllOf(HasSubstr("allreduce #2"), HasSubstr("waiting for rank 2"),
                                  HasSubstr("has not reached collective #2")));
    }
    EXPECT_TRUE(comm.is_poisoned());
    try {
      comm.allreduce(Buffer::of(v.data(), v.size()));
      ADD_FAILURE() << "a poisoned communicator accepted work";
    } catch (const InvalidUsage& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr("aborted"), HasSubstr("refuses new work"), HasSubstr("rank 2")));
    }
    done++;
  });
}

// The launcher tells a root cause from its consequences by DTRAIN_ERROR_FILE:
// the core must have written it, marked "peer", before the waiter sees the error.
TEST_P(CommunicatorTest, TimeoutIsWrittenToTheErrorFileAsAPeerLoss) {
  std::string path = ::testing::TempDir() + "dtrain-error-file-" + GetParam() + "-" + std::to_string(getpid());
  std::remove(path.c_str());
  ASSERT_EQ(setenv("DTRAIN_ERROR_FILE", path.c_str(), 1), 0);
  with_absent_peer(GetParam(), 16, milliseconds(1500), [&](Communicator& comm, std::vector<float>& v) {
    try {
      comm.allreduce(Buffer::of(v.data(), v.size()), ReduceOp::Sum, CallOptions{milliseconds(400)})->wait();
      ADD_FAILURE() << "allreduce completed without rank 1";
    } catch (const TimeoutError&) {
      std::ifstream f(path);
      ASSERT_TRUE(f.good()) << path << " was not written before the error reached the waiter";
      std::stringstream all;
      all << f.rdbuf();
      EXPECT_THAT(all.str(), AllOf(::testing::StartsWith("peer\n"), HasSubstr("waiting for rank 1")));
    }
  });
  unsetenv("DTRAIN_ERROR_FILE");
  std::remove(path.c_str());
}

TEST_P(CommunicatorTest, WaitTimeoutShortensTheDeadline) {
  run_ranks(GetParam(), 2, seconds(60), [&](int r, Communicator& comm) {
    if (r == 1) {
      std::this_thread::sleep_for(milliseconds(2000));
      return;
    }
    std::vector<int32_t> v(8, 1);
    auto w = comm.allreduce(Buffer::of(v.data(), v.size()));
    auto t0 = steady_clock::now();
    EXPECT_THROW(w->wait(milliseconds(300)), TimeoutError);
    // The wait's 300 ms, not the communicator's 60 s (slack for a loaded machine).
    EXPECT_LT(duration_cast<milliseconds>(steady_clock::now() - t0).count(), 10000);
    EXPECT_TRUE(w->is_completed());
    EXPECT_TRUE(w->exception() != nullptr);
  });
}

TEST_P(CommunicatorTest, RecvFromSilentPeerNamesThePeer) {
  run_ranks(GetParam(), 2, seconds(60), [&](int r, Communicator& comm) {
    if (r == 1) {
      std::this_thread::sleep_for(milliseconds(1500));
      return;
    }
    std::vector<double> v(4);
    try {
      comm.recv(Buffer::of(v.data(), v.size()), 1, 3, CallOptions{milliseconds(500)})->wait();
      ADD_FAILURE() << "recv completed without a sender";
    } catch (const TimeoutError& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr("recv"), HasSubstr("waiting for rank 1")));
    }
  });
}

TEST_P(CommunicatorTest, BadArgumentsAreRefusedBeforeTheBackend) {
  run_ranks(GetParam(), 1, seconds(10), [&](int, Communicator& comm) {
    std::vector<float> a(4), b(5);
    EXPECT_THROW(comm.allreduce(Buffer::of(a.data(), 4), Buffer::of(b.data(), 5), ReduceOp::Sum), InvalidUsage);
    EXPECT_THROW(comm.allgather(Buffer::of(a.data(), 4), Buffer::of(b.data(), 5)), InvalidUsage);
    EXPECT_THROW(comm.broadcast(Buffer::of(a.data(), 4), 3), InvalidUsage);
    EXPECT_THROW(comm.allreduce(Buffer(nullptr, 4, DType::F32)), InvalidUsage);
    std::vector<int32_t> c(4);
    EXPECT_THROW(comm.allreduce(Buffer::of(a.data(), 4), Buffer::of(c.data(), 4), ReduceOp::Sum), InvalidUsage);
    // CUDA buffers: cuda_staging_test.cc.
    EXPECT_FALSE(comm.is_poisoned()) << "refused calls must not poison";
  });
}

TEST_P(CommunicatorTest, DroppedWorkStillCompletes) {
  run_ranks(GetParam(), 2, seconds(30), [&](int, Communicator& comm) {
    std::vector<float> v(1 << 16, 1.0f);
    comm.allreduce(Buffer::of(v.data(), v.size()));  // Work dropped at once
    std::vector<float> w(4, 2.0f);
    comm.allreduce(Buffer::of(w.data(), w.size()))->wait();
    EXPECT_EQ(v[12345], 2.0f);
    EXPECT_EQ(w[0], 4.0f);
  });
}

TEST_P(CommunicatorTest, ApplicationAbortFailsInFlightWork) {
  // The aborted op's buffer outlives the communicator (work.h): the backend's
  // worker read it when the op started, and the abort, not that worker,
  // completes the Work (TSan saw a local vector freed here race with that read).
  with_absent_peer(GetParam(), 16, milliseconds(800), [&](Communicator& comm, std::vector<float>& v) {
    auto w = comm.allreduce(Buffer::of(v.data(), v.size()));
    std::thread aborter([&] {
      std::this_thread::sleep_for(milliseconds(100));
      comm.abort("test says stop");
    });
    EXPECT_THROW(w->wait(), AbortedError);
    aborter.join();
    EXPECT_THAT(comm.poison_reason(), HasSubstr("test says stop"));
  });
}

// CallOptions::blocking (the UCX backend runs such an op inside the call,
// with no plugin work): the result is there when the call returns, after a
// dropped (unwaited) op too, and a withheld rank still times out naming it.
TEST_P(CommunicatorTest, BlockingOpsCompleteAndTimeOutNamingTheWithheldRank) {
  std::atomic<int> done{0};
  auto* buffers = lasting_buffers(3, 2);
  CallOptions blocking;
  blocking.blocking = true;
  run_ranks(GetParam(), 3, seconds(30), [&](int r, Communicator& comm) {
    std::vector<float>& v = (*buffers)[r];
    auto w = comm.allreduce(Buffer::of(v.data(), v.size()), ReduceOp::Sum, blocking);
    EXPECT_TRUE(w->is_completed());
    EXPECT_TRUE(w->is_success());
    EXPECT_EQ(v[0], 3.0f);
    std::vector<float> big(1 << 14, 1.0f);
    comm.allreduce(Buffer::of(big.data(), big.size()));  // dropped: the next op queues behind it
    comm.barrier(blocking);
    comm.allreduce(Buffer::of(v.data(), v.size()), ReduceOp::Max, blocking)->wait();
    EXPECT_EQ(big[77], 3.0f);
    // Finished blocking works are reused once dropped; one still held is not.
    for (int i = 0; i < 100; ++i) {
      float x = static_cast<float>(r + i);
      comm.allreduce(Buffer::of(&x, 1), ReduceOp::Sum, blocking);
      ASSERT_EQ(x, static_cast<float>(3 + 3 * i)) << "op " << i;
    }
    EXPECT_TRUE(w->is_success());
    if (r == 2) {
      while (done.load() < 2) std::this_thread::sleep_for(milliseconds(10));
      return;
    }
    CallOptions o = blocking;
    o.timeout = milliseconds(1500);
    auto t0 = steady_clock::now();
    try {
      comm.allreduce(Buffer::of(v.data(), v.size()), ReduceOp::Sum, o);
      ADD_FAILURE() << "rank " << r << ": allreduce completed without rank 2";
    } catch (const TimeoutError& e) {
      auto took = duration_cast<milliseconds>(steady_clock::now() - t0);
      EXPECT_GE(took.count(), o.timeout.count() - 50);
      EXPECT_LE(took.count(), o.timeout.count() + 8000) << e.what();
      EXPECT_THAT(e.what(), AllOf(HasSubstr("allreduce #105"), HasSubstr("waiting for rank 2"),
                                  HasSubstr("has not reached collective #105")));
    }
    EXPECT_TRUE(comm.is_poisoned());
    done++;
  });
}

TEST_P(CommunicatorTest, ApplicationAbortEndsABlockingOp) {
  with_absent_peer(GetParam(), 2, milliseconds(800), [&](Communicator& comm, std::vector<float>& v) {
    std::thread aborter([&] {
      std::this_thread::sleep_for(milliseconds(100));
      comm.abort("test says stop");
    });
    CallOptions blocking;
    blocking.blocking = true;
    auto t0 = steady_clock::now();
    EXPECT_THROW(comm.allreduce(Buffer::of(v.data(), v.size()), ReduceOp::Sum, blocking), AbortedError);
    EXPECT_LT(duration_cast<milliseconds>(steady_clock::now() - t0).count(), 5000);
    aborter.join();
    EXPECT_THAT(comm.poison_reason(), HasSubstr("test says stop"));
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, CommunicatorTest, ::testing::Values("gloo", "ucx"),
                         [](const auto& info) { return info.param; });
