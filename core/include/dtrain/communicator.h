#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/buffer.h"
#include "dtrain/role_maker.h"
#include "dtrain/work.h"

namespace dtrain {

class Store;
class Backend;

namespace detail {
struct CommState;
// The Work of the last blocking collective that finished inside its call,
// reused by the next one once nobody else holds it (no allocation per op);
// taken under the flag, so even concurrent submitters never share it.
struct SpareWork {
  std::shared_ptr<Work> work;
  std::atomic<bool> taken{false};
};
}  // namespace detail

// Values match DT_OP_* of the plugin ABI.
enum class ReduceOp : int32_t { Sum = 0, Avg = 1, Max = 2, Min = 3, Prod = 4 };
const char* to_string(ReduceOp op);

struct CallOptions {
  // The op's deadline relative to submission; zero uses the communicator's default.
  std::chrono::milliseconds timeout{0};
  // The call returns only once the op has finished, as submitting it and
  // calling wait() on its Work at once would (c10d's async_op=False): it
  // throws the op's error, and the Work it returns is complete. A backend may
  // then run a collective inside the call itself, with no queued work and no
  // handle (the UCX backend does when nothing else is queued): the short path
  // for small ops whose result is needed at once (a metric sum, a loss-scale
  // check, a barrier). Deadline, watchdog and abort hold as for any op.
  bool blocking = false;

  // Options for a blocking call with the communicator's default deadline.
  static CallOptions wait_now() {
    CallOptions o;
    o.blocking = true;
    return o;
  }
};

struct CommOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  Role role = Role::Worker;
  // Rendezvous store shared by all ranks; required when world_size > 1. The
  // communicator scopes its keys under "<name>/".
  std::shared_ptr<Store> store;
  // The backend's own options as flat TOML ("key = literal" lines), e.g. from
  // Config::table_as_flat_toml("gloo"). Checked against the plugin's key list.
  std::string config_toml;
  // Default deadline of every op, and of connecting to peers.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Distinguishes several communicators of one job in the store; every rank
  // must use the same name for the same communicator.
  std::string name = "default";
  std::string job_id;
  // Parameter-server communicators (role Server or Worker on a backend with
  // the DT_CAP_PS_* bits): rank is the index among the processes of its role
  // and world_size equals num_workers. Zero for collective communicators.
  int num_servers = 0;
  int num_workers = 0;
  // The job's shared secret; a PS backend demands it from every client.
  std::string job_token;
};

// A group of ranks that run collectives together, on one backend plugin.
//
// Threading: ops are submitted by one thread at a time, in the same order on
// every rank. Works may be waited on from any thread. Buffers are owned by the
// caller and must stay valid until the op's Work completes.
//
// Argument checks (counts, root, peer, dtype, device) happen here before the
// backend sees the call, so every backend rejects bad calls with the same
// InvalidUsage message. An op the backend does not implement throws
// NotSupported("backend 'X' does not support Y").
class Communicator {
 public:
  explicit Communicator(std::shared_ptr<detail::CommState> state);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const std::string& backend_name() const;
  std::shared_ptr<Backend> backend() const;

  // In place: buf holds the input and receives the result.
  std::shared_ptr<Work> allreduce(const Buffer& buf, ReduceOp op = ReduceOp::Sum, CallOptions o = {});
  std::shared_ptr<Work> allreduce(const Buffer& send, const Buffer& recv, ReduceOp op, CallOptions o = {});
  std::shared_ptr<Work> broadcast(const Buffer& buf, int root, CallOptions o = {});
  // recv.count == send.count * size(), rank-major.
  std::shared_ptr<Work> allgather(const Buffer& send, const Buffer& recv, CallOptions o = {});
  // send.count == recv.count * size(); rank r receives the reduction of block r.
  std::shared_ptr<Work> reduce_scatter(const Buffer& send, const Buffer& recv, ReduceOp op = ReduceOp::Sum,
                                       CallOptions o = {});
  // recv is written on root only (it may be empty elsewhere).
  std::shared_ptr<Work> reduce(const Buffer& send, const Buffer& recv, ReduceOp op, int root, CallOptions o = {});
  // send.count == recv.count, divisible by size(); block j of send goes to rank j.
  std::shared_ptr<Work> alltoall(const Buffer& send, const Buffer& recv, CallOptions o = {});
  // Uneven all-to-all (MPI's alltoallv, c10d's alltoall_base with splits):
  // block j of send (send_counts[j] elements, blocks back to back) goes to
  // rank j and lands as block `rank()` of rank j's recv (recv_counts[j]
  // elements from rank j). ABI v1's alltoall takes equal blocks only, so this
  // is built here from send/recv (DT_CAP_SENDRECV) on tag kAlltoallvTag: every
  // backend gets it, with the core's deadlines and abort. This rank's own
  // block is not moved (the core copies no device memory): the caller copies
  // it. Returns one Work per message posted (none with one rank).
  static constexpr int kAlltoallvTag = 0x7ff0;
  std::vector<std::shared_ptr<Work>> alltoallv(const Buffer& send, const std::vector<size_t>& send_counts,
                                               const Buffer& recv, const std::vector<size_t>& recv_counts,
                                               CallOptions o = {});
  std::shared_ptr<Work> barrier(CallOptions o = {});
  std::shared_ptr<Work> send(const Buffer& buf, int peer, int tag = 0, CallOptions o = {});
  std::shared_ptr<Work> recv(const Buffer& buf, int peer, int tag = 0, CallOptions o = {});

  // Fails every in-flight op and poisons the communicator. Thread-safe.
  void abort(const std::string& reason = "aborted by the application");
  bool is_poisoned() const;
  // Why the communicator is unusable ("" while it is healthy).
  std::string poison_reason() const;

 private:
  std::shared_ptr<detail::CommState> state_;
  detail::SpareWork spare_;
};

}  // namespace dtrain
