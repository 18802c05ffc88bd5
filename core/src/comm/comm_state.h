#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/abi/backend_v1.h"
#include "dtrain/sdk/clock.h"
#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/store.h"

namespace dtrain {
namespace detail {

using Clock = std::chrono::steady_clock;

// The SDK's coarse clock and deadline rule (dtrain/sdk/clock.h), shared with
// the plugins.
using sdk::coarse_now;

struct CommState;

// The lock of a communicator's in-flight list: held for a few pointer moves
// on every op (track, untrack), rarely longer (the watchdog's scan, an
// abort). One atomic exchange to take, a plain store to give back, where a
// std::mutex costs two locked instructions; a waiter yields its CPU.
class SpinLock {
 public:
  void lock() {
    while (held_.exchange(true, std::memory_order_acquire))
      while (held_.load(std::memory_order_relaxed)) std::this_thread::yield();
  }
  void unlock() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

// Core-side state of one submitted op. Finishes exactly once (first writer
// wins: the waiter, the watchdog, or an abort).
struct WorkState : std::enable_shared_from_this<WorkState> {
  std::shared_ptr<CommState> comm;
  // Null while a blocking op runs inside its submitting call (DT_CALL_WAIT),
  // and for good when it succeeded there; set before the work is shared
  // otherwise (or, for a blocking op, read by the watchdog only past the
  // deadline, as the op's tracking keeps it in view).
  std::atomic<dt_work_h> handle{nullptr};
  // What the op is, kept as parts: the text is built only for messages.
  const char* op_name = "";         // "allreduce"
  const char* op_detail = nullptr;  // "sum", or null
  int32_t dtype = -1;               // of its buffer, -1 if none
  size_t count = 0;
  bool collective = true;
  // A parameter-server op: DT_ERR_INVALID_USAGE / DT_ERR_NOT_SUPPORTED fail
  // the op only (the server refused one request); label names its table.
  bool ps = false;
  std::string label;  // "table 'emb', 64 keys x 8", or ""
  uint64_t seq = 0;   // collective sequence number (0 for p2p)
  int peer = -1;      // p2p peer
  Clock::time_point submitted;
  std::atomic<int64_t> deadline_ns{0};  // steady clock
  // Links of the communicator's in-flight list (guarded by comm->mu).
  WorkState* prev = nullptr;
  WorkState* next = nullptr;
  std::atomic<bool> tracked{false};  // written under comm->mu

  std::atomic<bool> claimed{false};  // the first finish() takes it
  std::atomic<bool> done{false};     // set after error is written; error is then never written again
  std::exception_ptr error;

  // User-provided: make_shared then runs only the member initializers
  // instead of zero-filling the whole object first (a rep stos per op).
  WorkState() {}
  ~WorkState();
  // "allreduce #42 (f32 x 1024, sum)", "ps_pull_sparse (table 'emb', 64 keys x 8)"
  std::string what() const;
  bool finished();
  // Returns true if this call finished the work. before_done runs on that
  // call only, once the work holds err and has left the in-flight list, and
  // before any waiter can see it finished: a failure poisons the communicator
  // there, so whoever sees the error sees the communicator poisoned.
  bool finish(std::exception_ptr err, const std::function<void()>& before_done = nullptr);
  Clock::time_point deadline() const { return Clock::time_point(Clock::duration(deadline_ns.load())); }
};

struct StoreBridge {
  dt_store_v1_t table{};
  std::shared_ptr<Store> store;
};

struct CommState : std::enable_shared_from_this<CommState> {
  std::shared_ptr<Backend> backend;
  const dt_backend_v1_t* table = nullptr;  // the plugin's function table
  dt_comm_h handle = nullptr;
  uint64_t caps = 0;       // the backend's capability bits (read per op)
  bool call_wait = false;  // the plugin reads DT_CALL_WAIT (ABI minor >= 2)
  bool supports(uint64_t cap) const { return (caps & cap) == cap; }
  int rank = 0;
  int size = 1;
  // Parameter-server communicators: rank is the index among the processes
  // of its role; size is the number of workers.
  bool ps = false;
  Role role = Role::Worker;
  int num_servers = 0;
  std::string name;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<Store> store;  // scoped to this communicator
  StoreBridge bridge;            // what the plugin sees (scoped further)

  std::atomic<uint64_t> coll_seq{0};

  SpinLock mu;  // the in-flight list and poison_reason
  std::atomic<bool> poisoned{false};
  std::string poison_reason;
  WorkState* inflight = nullptr;  // head of the in-flight list, newest first

  // When this rank's heartbeat was last published (steady clock, ns): the
  // watchdog publishes, and so does lost_peers() on the thread that failed.
  std::atomic<int64_t> last_publish_ns{0};

  ~CommState();
  // Marks the communicator unusable and aborts it in the plugin. First reason wins.
  // peer_lost: the abort follows a peer's failure (a timeout or a transport
  // error), not this process's own; the first abort of the process is written
  // to $DTRAIN_ERROR_FILE so the launcher can tell root causes from consequences.
  void poison(const std::string& reason, bool peer_lost = false);
  std::string reason();
  // Fails a work because its deadline passed: diagnoses which ranks are
  // missing, poisons the communicator and fails every in-flight work.
  // backend_msg: the plugin's own words when it reported the timeout (kept
  // for PS ops, whose servers name the workers a sync step waits for).
  void expire(const std::shared_ptr<WorkState>& w, const char* backend_msg = nullptr);
  // Fails a work with the backend's error and poisons the communicator.
  void fail(const std::shared_ptr<WorkState>& w, dt_status_t st, const std::string& message);
  // Records a finished plugin status (not DT_IN_PROGRESS) on a work.
  void settle(const std::shared_ptr<WorkState>& w, dt_status_t st);
  void track(const std::shared_ptr<WorkState>& w);
  void untrack(WorkState* w);
  // The in-flight works still alive (under mu).
  std::vector<std::shared_ptr<WorkState>> inflight_works();
  // Why w timed out: the backend's own words when it gave them, else which
  // peers it waits for (from their heartbeats).
  std::string diagnose(const WorkState& w, const char* backend_msg = nullptr);
  // Which peers the work is waiting for, from their heartbeats.
  std::string peer_status(const WorkState& w);
  // After a transport failure: the peers whose heartbeat stopped, watched for
  // a few heartbeat periods (ours published meanwhile), named as lost; else
  // peer_status(). Every live process keeps publishing its heartbeat, even on
  // a poisoned communicator, so survivors are never blamed.
  std::string lost_peers(const WorkState& w);
  void publish_heartbeat(bool force);
  std::string heartbeat_key(int r) const { return heartbeat_key(role, r); }
  std::string heartbeat_key(Role of, int r) const {
    if (!ps) return "hb/" + std::to_string(r);
    return std::string("hb/") + (of == Role::Server ? "server." : "worker.") + std::to_string(r);
  }
  // "rank 3 of 4", "worker 1 of 2", "server 0 of 3"
  std::string who() const;
  // PS communicators: which servers look dead, from their heartbeats.
  std::string server_status();
};

// Creates the plugin's communicator and the core's state for it (checks the
// options, scopes the store, registers with the watchdog).
std::shared_ptr<CommState> create_comm_state(const std::shared_ptr<Backend>& backend, const CommOptions& options);

std::exception_ptr make_backend_error(const std::string& backend, dt_status_t st, const std::string& msg);
// Status <-> error kind, lossless both ways (Config goes out as invalid usage).
ErrorKind kind_of_status(dt_status_t st);
dt_status_t status_of_kind(ErrorKind kind);

}  // namespace detail
}  // namespace dtrain
