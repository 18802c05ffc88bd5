// ABI 1.1 and the plugins built before it: a v1.0 table (abi_minor 0, ending
// where the PS slots begin) loads and runs; a table that claims PS caps with
// NULL slots is refused naming the slot; a backend without PS caps refuses
// PS communicators with a clear NotSupported.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/ps.h"
#include "dtrain/store.h"

using namespace dtrain;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(PsAbi, AVersion10PluginLoadsAndAllReduces) {
  PluginRegistry reg({DTRAIN_BAD_PLUGIN_DIR});
  auto b = reg.load("v10");
  EXPECT_EQ(b->info().abi_major, 1u);
  EXPECT_EQ(b->info().abi_minor, 0u);
  EXPECT_FALSE(b->supports(DT_CAP_PS_SERVER));
  EXPECT_EQ(b->info().caps_string(), "allreduce cpu");

  constexpr int kWorld = 3;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::vector<float>> out(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r)
    threads.emplace_back([&, r] {
      try {
        CommOptions o;
        o.rank = r;
        o.world_size = kWorld;
        o.store = store;
        o.timeout = std::chrono::seconds(20);
        auto comm = b->create_communicator(o);
        out[r] = {1.0f * r, 10.0f, -2.0f * r, 0.5f};
        comm->allreduce(Buffer(out[r].data(), out[r].size(), DType::F32))->wait();
        // A blocking call (ABI 1.2's DT_CALL_WAIT, never shown to a 1.0
        // plugin) waits for the plugin's work as usual.
        CallOptions blocking;
        blocking.blocking = true;
        std::vector<float> one{1.0f};
        auto w = comm->allreduce(Buffer(one.data(), 1, DType::F32), ReduceOp::Sum, blocking);
        if (!w->is_success() || one[0] != 3.0f) errors[r] = "blocking allreduce gave " + std::to_string(one[0]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(out[r], (std::vector<float>{3.0f, 30.0f, -6.0f, 1.5f})) << "rank " << r;
  }
}

TEST(PsAbi, AVersion10PluginRefusesParameterServerWork) {
  PluginRegistry reg({DTRAIN_BAD_PLUGIN_DIR});
  auto b = reg.load("v10");
  CommOptions o;
  o.store = std::make_shared<MemoryStore>();
  o.num_servers = 1;
  o.num_workers = 1;
  o.timeout = std::chrono::seconds(5);
  try {
    ps::connect_worker(b, o, ps::ModeOptions{});
    FAIL() << "a v1.0 plugin accepted a parameter-server worker";
  } catch (const NotSupported& e) {
    EXPECT_THAT(e.what(), HasSubstr("backend 'v10' does not support parameter-server tables (ps-server)"));
  }
  o.role = Role::Server;
  EXPECT_THROW(ps::start_server(b, o), NotSupported);
  EXPECT_THROW(b->create_communicator(o), NotSupported);
}

TEST(PsAbi, PsCapsWithNullSlotsAreRefusedNamingTheSlot) {
  PluginRegistry reg({DTRAIN_BAD_PLUGIN_DIR});
  try {
    reg.load("psnull");
    FAIL() << "a table claiming ps-dense with NULL slots was loaded";
  } catch (const InvalidUsage& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("libdtrain_psnull.so"), HasSubstr("claims ps-dense"),
                                HasSubstr("has no ps_table function")));
  }
}
