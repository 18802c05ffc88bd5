#pragma once
// A worker's PS operation as the core sees it (an sdk::Work), fanned out to
// one or more calls ("parts": a server, or a chunk of keys on a server), and
// the small thread pool the parts run on.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/sdk/backend.h"

namespace dtrain::ps_grpc {

// An sdk::Work whose wait() takes any timeout: a caller may pass the time
// left to an unbounded deadline (the core's wait on ps_serve does), which
// sdk::Work::wait would add to the clock and overflow; waits are capped at a
// day (the caller loops on DT_IN_PROGRESS).
class LongWork : public sdk::Work {
 public:
  dt_status_t wait(int64_t timeout_ms) override {
    constexpr int64_t kDayMs = 24 * 3600 * 1000;
    return sdk::Work::wait(timeout_ms > kDayMs ? kDayMs : timeout_ms);
  }
};

// Completes when every part has reported: DT_OK when all succeeded (after
// on_success ran), else the first failure. Thread-safe.
//
// The caller's buffers may be freed once the op is complete (aborted ops
// included), so every write into them goes through write_out(), which holds
// a shared lock that abort() takes exclusively: once abort() returns, no part
// touches the caller's memory again.
class Op : public LongWork {
 public:
  Op(std::string what, int parts, sdk::Clock::time_point deadline, int64_t timeout_ms);
  const std::string& what() const { return what_; }
  sdk::Clock::time_point deadline() const { return deadline_; }
  int64_t timeout_ms() const { return timeout_ms_; }
  bool done() { return test() != DT_IN_PROGRESS; }

  // wait() first polls test() for up to this long, yielding the CPU between
  // polls, then sleeps (wait_spin_us): set before the op is handed out.
  void set_wait_spin(std::chrono::microseconds spin) { spin_ = spin; }
  dt_status_t wait(int64_t timeout_ms) override;

  // One part finished (DT_OK or its failure).
  void part_done(dt_status_t status, const std::string& message);
  // Runs f (a copy into the caller's memory) unless the op already completed;
  // false if it had.
  template <typename F>
  bool write_out(F&& f) {
    std::shared_lock<std::shared_mutex> lk(out_mu_);
    if (done()) return false;
    f();
    return true;
  }
  void abort(const std::string& message);

  // Ops whose completion this op's parts wait for before they send (the
  // table's declaration, the previous push to the table), up to the deadline.
  // Weak: an op no longer referenced is no longer in flight.
  std::vector<std::weak_ptr<Op>> after;
  // Runs on the thread of the last part when every part succeeded; may throw
  // sdk::Error, which fails the op.
  std::function<void()> on_success;

 private:
  std::string what_;
  sdk::Clock::time_point deadline_;
  int64_t timeout_ms_;
  std::chrono::microseconds spin_{0};
  std::shared_mutex out_mu_;
  std::atomic<int> pending_;
  std::mutex err_mu_;
  dt_status_t first_status_ = DT_OK;
  std::string first_error_;
};

// Runs tasks on threads started on demand (a task may block in a gRPC call
// until its deadline, so a fixed-size pool could starve); idle threads wait
// for the next task.
class TaskPool {
 public:
  TaskPool() = default;
  ~TaskPool() { join(); }
  void post(std::function<void()> task);
  // Runs what is queued, then joins the threads (a task may still post).
  void join();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stop_ = false;
};

}  // namespace dtrain::ps_grpc
