#pragma once

#include <chrono>
#include <exception>
#include <memory>

namespace dtrain {

namespace detail {
struct WorkState;
struct WorkAccess;
}  // namespace detail

// One submitted operation (as c10d's Work). Returned by every Communicator op.
// Thread-safe: any thread may test, wait or abort it.
//
// Deadlines: every op has one (its CallOptions timeout, else the communicator's
// default). The core's single watchdog thread enforces it for every backend:
// when it passes, the op fails with TimeoutError naming the ranks that did not
// arrive, and the whole communicator is aborted ("poisoned"): every other
// in-flight op fails and later submissions throw InvalidUsage with the reason.
// A failed op (peer lost, transport error) poisons the communicator the same way.
//
// Dropping a Work without waiting is allowed: the op still runs to completion,
// and its buffers must stay valid until it has.
//
// Buffers of a failed op (timeout, abort, peer lost): a backend whose
// transport calls can be interrupted (UCX) lets go of them before the
// communicator's destructor returns. One whose calls cannot (Gloo's TCP
// pairs) may still read or write them until the transport's own timeout
// ends the call (the op's deadline, at most the communicator's timeout,
// later), even after the communicator is destroyed: keep them alive that
// long, or give a failed job's buffers to a process that is about to exit.
class Work {
 public:
  explicit Work(std::shared_ptr<detail::WorkState> state);
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Non-blocking: true once the op finished (successfully or not).
  bool is_completed();
  // True once the op finished successfully.
  bool is_success();
  // Blocks until the op finishes; throws its error (TimeoutError, RemoteError,
  // AbortedError, ...). A non-zero timeout shortens the op's deadline to
  // now + timeout (the watchdog then fails it as above); zero keeps the deadline.
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::zero());
  // The op's error once it failed; null while running or after success.
  std::exception_ptr exception();
  // Aborts the op and, as any failure, its communicator.
  void abort();

 private:
  friend struct detail::WorkAccess;
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace dtrain
