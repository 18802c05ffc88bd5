#pragma once
// Clocks and the one deadline rule shared by the core and every plugin.
// Header-only, standard C++17 plus POSIX clock_gettime.

#include <time.h>

#include <chrono>
#include <cstdint>

namespace dtrain::sdk {

using Clock = std::chrono::steady_clock;

// steady_clock's time from CLOCK_MONOTONIC_COARSE (libstdc++'s steady_clock is
// CLOCK_MONOTONIC: the same epoch), at most a scheduler tick behind, several
// times cheaper to read. For op deadlines, not for intervals under a tick.
inline Clock::time_point coarse_now() {
#ifdef CLOCK_MONOTONIC_COARSE
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
#else
  return Clock::now();
#endif
}

// The deadline of an op submitted now with timeout_ms (<= 0: the
// communicator's default_ms). The rule is the coarse clock, always: a deadline
// is whole milliseconds to minutes away, so a tick (1-4 ms) early or late does
// not matter, while the precise clock costs a vDSO call on every submission of
// the latency path. Intervals shorter than a tick (an op queue's grace period,
// a spin budget) are measured with Clock::now() by the code that needs them,
// never derived from a deadline.
inline Clock::time_point deadline_after(int64_t timeout_ms, int64_t default_ms) {
  return coarse_now() + std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : default_ms);
}

// Milliseconds left until deadline plus slack, at least 1 (for transports
// that take a relative timeout).
inline std::chrono::milliseconds remaining_ms(Clock::time_point deadline,
                                              std::chrono::milliseconds slack = std::chrono::milliseconds(0)) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()) + slack;
  return left.count() < 1 ? std::chrono::milliseconds(1) : left;
}

}  // namespace dtrain::sdk
