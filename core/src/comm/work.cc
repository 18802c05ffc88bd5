#include "dtrain/work.h"

#include <algorithm>
#include <limits>

#include "comm/comm_state.h"
#include "comm/watchdog.h"

namespace dtrain {

using detail::Clock;

Work::Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

Work::~Work() {
  if (state_ && !is_completed()) detail::Watchdog::instance().adopt_orphan(std::move(state_));
}

bool Work::is_completed() {
  auto& s = *state_;
  if (s.finished()) return true;
  dt_status_t st = s.comm->table->work_test(s.handle);
  if (st == DT_IN_PROGRESS) return false;
  s.comm->settle(state_, st);
  return true;
}

bool Work::is_success() { return is_completed() && !exception(); }

void Work::wait(std::chrono::milliseconds timeout) {
  auto& s = *state_;
  if (timeout.count() > 0) {
    int64_t d = (Clock::now() + timeout).time_since_epoch().count();
    int64_t cur = s.deadline_ns.load();
    while (d < cur && !s.deadline_ns.compare_exchange_weak(cur, d)) {
    }
    detail::Watchdog::instance().wake();
  }
  bool first = timeout.count() <= 0;
  while (!s.finished()) {
    // The plugin may run the op inline in this call, bounded by the time left
    // to the deadline; comm_abort (from the watchdog) wakes it earlier. The
    // first call skips the clock read: the watchdog holds the exact deadline.
    auto now = first ? s.submitted : Clock::now();
    first = false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(s.deadline() - now).count();
    // An op without a deadline (ps_serve) waits without a limit (-1), never
    // with a huge one a plugin could overflow adding it to its clock.
    bool unbounded = s.deadline_ns.load() == std::numeric_limits<int64_t>::max();
    dt_status_t st = s.comm->table->work_wait(s.handle, unbounded ? -1 : std::max<int64_t>(left, 10));
    if (st == DT_IN_PROGRESS) {
      if (s.comm->poisoned.load())
        s.finish(std::make_exception_ptr(AbortedError(s.what() + " aborted: " + s.comm->reason())));
      continue;
    }
    s.comm->settle(state_, st);
  }
  // error was written before done was set, and is never written again.
  if (s.error) std::rethrow_exception(s.error);
}

std::exception_ptr Work::exception() {
  // error is written before done and never again.
  return state_->finished() ? state_->error : nullptr;
}

void Work::abort() {
  state_->comm->poison("rank " + std::to_string(state_->comm->rank) + ": " + state_->what() +
                       " aborted by the application");
  state_->finish(std::make_exception_ptr(AbortedError(state_->what() + " aborted by the application")));
}

}  // namespace dtrain
