// The SDK's OpQueue: what happens to a drainer still blocked in a transport
// call when its queue shuts down (DetachedDrainers).
#include "dtrain/sdk/op_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

namespace {

using namespace std::chrono_literals;
using dtrain::sdk::Clock;
using dtrain::sdk::DetachedDrainers;
using dtrain::sdk::OpQueue;
using Flag = std::shared_ptr<std::atomic<bool>>;

Flag flag() { return std::make_shared<std::atomic<bool>>(false); }

bool wait_for(const Flag& f, std::chrono::milliseconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (!f->load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  return f->load();
}

TEST(DetachedDrainers, CloseWaitsForADrainerThatEndsWithinTheWait) {
  Flag done = flag();
  auto start = std::chrono::steady_clock::now();
  {
    DetachedDrainers registry(5s);
    registry.adopt(std::thread([done] {
                     std::this_thread::sleep_for(200ms);
                     done->store(true);
                   }),
                   done);
    EXPECT_EQ(registry.size(), 1u);
  }
  EXPECT_TRUE(done->load());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 190ms);
}

TEST(DetachedDrainers, ForgetsTheDoneOnesWhenItAdoptsAnother) {
  DetachedDrainers registry(5s);
  Flag first_done = flag(), release = flag();
  registry.adopt(std::thread([first_done] { first_done->store(true); }), first_done);
  ASSERT_TRUE(wait_for(first_done, 10s));
  Flag second_done = flag();
  registry.adopt(std::thread([second_done, release] {
                   wait_for(release, 60s);
                   second_done->store(true);
                 }),
                 second_done);
  EXPECT_EQ(registry.size(), 1u);
  release->store(true);
  EXPECT_TRUE(wait_for(second_done, 10s));
}

TEST(DetachedDrainers, CloseGivesUpOnADrainerStillBlockedAfterTheWait) {
  Flag release = flag(), finished = flag();
  auto start = std::chrono::steady_clock::now();
  {
    DetachedDrainers registry(100ms);
    Flag done = flag();
    registry.adopt(std::thread([done, release, finished] {
                     wait_for(release, 60s);
                     done->store(true);
                     finished->store(true);
                   }),
                   done);
  }
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 100ms);
  EXPECT_LT(took, 5s);
  EXPECT_FALSE(finished->load());
  release->store(true);
  EXPECT_TRUE(wait_for(finished, 10s));
}

// A communicator may shut down while the process exits (the core's watchdog
// held its last reference): its drainer is adopted while close() runs, or after.
TEST(DetachedDrainers, CloseWaitsForADrainerAdoptedWhileItCloses) {
  DetachedDrainers registry(5s);
  Flag first_done = flag(), second_done = flag(), closed = flag();
  registry.adopt(std::thread([first_done] {
                   std::this_thread::sleep_for(300ms);
                   first_done->store(true);
                 }),
                 first_done);
  std::thread closer([&] {
    registry.close();
    closed->store(true);
  });
  std::this_thread::sleep_for(100ms);
  ASSERT_FALSE(closed->load());
  registry.adopt(std::thread([second_done] {
                   std::this_thread::sleep_for(400ms);
                   second_done->store(true);
                 }),
                 second_done);
  closer.join();
  EXPECT_TRUE(second_done->load());
  EXPECT_EQ(registry.size(), 0u);
}

TEST(DetachedDrainers, DoesNotWaitForADrainerAdoptedAfterItClosed) {
  DetachedDrainers registry(5s);
  registry.close();
  Flag done = flag(), release = flag();
  auto start = std::chrono::steady_clock::now();
  registry.adopt(std::thread([done, release] {
                   wait_for(release, 60s);
                   done->store(true);
                 }),
                 done);
  registry.close();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(registry.size(), 0u);
  release->store(true);
  EXPECT_TRUE(wait_for(done, 10s));
}

// Gloo's case: a non-interruptible queue shut down after an abort while its
// drainer is blocked in a body. shutdown() returns without waiting for the
// body and hands the drainer to the plugin's registry, which detaches it and
// counts it until it is done.
TEST(OpQueue, ShutdownHandsADrainerBlockedInABodyToTheRegistry) {
  OpQueue::Settings settings;
  settings.interruptible = false;
  settings.lazy = true;
  auto queue = OpQueue::create(settings);
  Flag entered = flag(), release = flag(), left = flag();
  size_t before = DetachedDrainers::get().size();
  auto work = queue->submit(
      [entered, release, left](Clock::time_point) {
        entered->store(true);
        wait_for(release, 60s);
        left->store(true);
      },
      Clock::now() + 60s, /*inline_ok=*/false);
  ASSERT_TRUE(wait_for(entered, 10s));
  queue->abort("test abort");
  auto start = std::chrono::steady_clock::now();
  queue->shutdown("test shutdown");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_FALSE(left->load());
  EXPECT_EQ(DetachedDrainers::get().size(), before + 1);
  release->store(true);
  EXPECT_TRUE(wait_for(left, 10s));
  // The drainer's flag is set after the body: wait for it to be counted done.
  for (int i = 0; i < 1000 && DetachedDrainers::get().size() > before; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(DetachedDrainers::get().size(), before);
}

}  // namespace
