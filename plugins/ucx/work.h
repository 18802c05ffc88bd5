#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/sdk/backend.h"

namespace dtrain::ucx_backend {

using Clock = std::chrono::steady_clock;

class OpQueue;

// A collective queued on a communicator's OpQueue. Its body runs once, on the
// thread that waits for it (inline, no hand-off) or on the queue's lazy
// drainer when nobody has waited for it within the grace period.
class CollectiveWork : public sdk::Work {
 public:
  using Body = std::function<void(Clock::time_point deadline)>;
  CollectiveWork(std::shared_ptr<OpQueue> queue, Body body, Clock::time_point deadline, Clock::time_point now);
  // Lock-free until the op is done (the latency path polls it).
  dt_status_t test() override;
  // Runs this op (and the ones queued before it) on the calling thread, for at
  // most timeout_ms; an op cut short by that bound fails with DT_ERR_TIMEOUT.
  dt_status_t wait(int64_t timeout_ms) override;
  // Runs the body once with a deadline capped at cap, then completes.
  void run(Clock::time_point cap);
  // complete() plus the lock-free done flag; every completion goes here.
  void finish(dt_status_t status, const std::string& message);

  const Clock::time_point deadline;
  const Clock::time_point submitted;

 private:
  std::shared_ptr<OpQueue> queue_;
  Body body_;
  std::atomic<bool> done_{false};
};

// The in-order queue of one communicator's collectives. Exactly one thread
// runs ops at a time (claim/release); the waiter of an op runs everything
// queued up to it. A drainer thread wakes every poll interval while the
// communicator is busy and runs ops nobody claimed within the grace period,
// so dropped works complete and submitted ops progress during the caller's
// compute; it is never woken per op, so the latency path has no hand-off.
class OpQueue : public std::enable_shared_from_this<OpQueue> {
 public:
  struct Timing {
    std::chrono::microseconds grace{1000};
    std::chrono::microseconds poll{2000};
    std::chrono::milliseconds idle{500};
  };
  // idle_hook runs on the drainer when no op is running (the communicator
  // progresses posted point-to-point transfers there).
  OpQueue(Timing timing, std::function<void()> idle_hook);
  ~OpQueue();
  void start();  // starts the drainer thread
  void stop();   // joins it; queued ops are failed with DT_ERR_ABORTED

  std::shared_ptr<CollectiveWork> submit(CollectiveWork::Body body, Clock::time_point deadline,
                                         Clock::time_point now);
  // Runs queued ops in order until target completes or cap passes.
  void run_until(CollectiveWork* target, Clock::time_point cap);
  // Fails every queued op and the running one with DT_ERR_ABORTED.
  void abort(const std::string& reason);
  // Blocks until no op body is running (used by destroy after abort).
  void quiesce();

 private:
  bool claim_head(std::unique_lock<std::mutex>& lk, std::shared_ptr<CollectiveWork>* out);
  void release(const std::shared_ptr<CollectiveWork>& w);
  void drain_loop();

  Timing timing_;
  std::function<void()> idle_hook_;
  std::mutex mu_;
  std::condition_variable cv_;       // drainer sleeps here
  std::condition_variable idle_cv_;  // running_ became null
  std::deque<std::shared_ptr<CollectiveWork>> queue_;
  std::shared_ptr<CollectiveWork> running_;
  bool stop_ = false;
  bool aborted_ = false;
  bool deep_sleep_ = false;
  std::string reason_;
  Clock::time_point last_submit_{};
  std::thread drainer_;
};

}  // namespace dtrain::ucx_backend
