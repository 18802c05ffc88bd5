#pragma once
// The UCX fabric of one communicator: the UCP context, worker and endpoints,
// the progress loop (spin, then the worker's event fd through epoll), and the
// shared-memory mailboxes between ranks of one host.

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "dtrain/sdk/backend.h"

namespace dtrain::ucx_backend {

using Clock = sdk::Clock;

// Peer-failure handling of endpoints: auto = only to peers on other hosts.
enum class ErrorHandling { Auto, Peer, None };

// Layout of a shared-memory mailbox. Ring part: two counters on their own
// cache lines, then Settings::depth slots of Settings::chunk_bytes; the owner
// writes chunk k into slot k % depth and publishes head = k + 1, the reader
// (the next rank) reads it and publishes tail = k + 1. Small part (flat
// all-reduce of up to kMaxFlatRanks ranks), double-buffered by the parity of
// the small op's number k: up to kTinyBytes travel in the cache line
// kTiny + 64 * (k % 2) together with its sequence word (one line moves from
// writer to readers per op); larger ones in buffer k % 2 after kRing, with
// seq = k + 1 published at kSeq. Readers send no acknowledgement: a rank
// publishes op k + 1 only after reading every peer's op k, so when a rank has
// seen every peer's op k - 1, they are all done with its op k - 2's buffer,
// the one op k reuses. Counters only grow, across collectives, since every
// rank runs the same sequence of ops.
struct MailboxLayout {
  static constexpr int kMaxFlatRanks = 16;
  static constexpr size_t kHead = 0;
  static constexpr size_t kTail = 128;
  static constexpr size_t kSeq = 256;
  static constexpr size_t kTiny = 512;  // two lines: data, then the sequence word at kTinySeq
  static constexpr size_t kTinyBytes = 56;
  static constexpr size_t kTinySeq = 56;
  static constexpr size_t kRing = 4096;
  static size_t tiny_at(uint64_t k) { return kTiny + 64 * static_cast<size_t>(k % 2); }
  static size_t small_at(size_t chunk, int depth, size_t small, int k) {
    return kRing + chunk * static_cast<size_t>(depth) + static_cast<size_t>(k % 2) * small;
  }
  static size_t bytes(size_t chunk, int depth, size_t small) {
    return kRing + chunk * static_cast<size_t>(depth) + 2 * small;
  }
};

// One posted UCX tag transfer. done() polls it; a request that failed keeps
// its status. Not thread-safe: the owner serializes access.
struct Request {
  void* handle = nullptr;
  ucs_status_t status = UCS_INPROGRESS;
  int peer = -1;
  bool is_send = false;
  bool done() const { return status != UCS_INPROGRESS; }
};

// A communicator's UCX state: its own context and worker (multi-thread mode:
// the caller's thread, the drainer and p2p waiters may all progress it),
// one endpoint per peer, connected by worker addresses exchanged through the
// core's store. Progress loops spin for Settings::spin, then sleep on the
// worker's event fd (ucp_worker_arm) in short slices, always bounded by the
// deadline and woken by abort.
class Fabric {
 public:
  // mailbox_bytes > 0 asks for the shared-memory mailboxes (see
  // MailboxLayout). fingerprint: the options every rank must share; a peer
  // with other ones fails the creation with DT_ERR_INVALID_USAGE.
  Fabric(const sdk::CommInit& init, const std::string& tls, const std::string& net_devices, ErrorHandling errors,
         std::chrono::microseconds spin, size_t mailbox_bytes, const std::string& fingerprint);
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  Request isend(int peer, uint64_t tag, const void* ptr, size_t bytes);
  Request irecv(int peer, uint64_t tag, void* ptr, size_t bytes);
  // Updates r from UCX; true when finished (ok or failed).
  bool poll(Request& r);
  // Progresses until every request is done; throws on failure, deadline or abort.
  void wait_all(Request* reqs, size_t n, Clock::time_point deadline, const char* what);
  void wait(Request& r, Clock::time_point deadline, const char* what) { wait_all(&r, 1, deadline, what); }
  // Progresses until done() holds; throws DT_ERR_TIMEOUT past the deadline
  // (naming waiting_for()) and DT_ERR_ABORTED after abort().
  void progress_until(const std::function<bool()>& done, Clock::time_point deadline, const char* what,
                      const std::function<int()>& waiting_for);
  // Releases a request that will no longer be waited for (cancels a recv).
  void discard(Request& r);
  // One round of progress; returns true if anything happened.
  bool progress();
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }
  // Throws DT_ERR_REMOTE naming the peer if r failed.
  void check(const Request& r, const char* what) const;

  // Shared-memory ring mailboxes, when every rank is on this host and UCX
  // maps them (ucp_mem_map ALLOCATE over sysv/posix, rkey exchanged through
  // the store, ucp_rkey_ptr for direct access): this rank's own mailbox,
  // written by this rank and read by the next one, and the previous rank's.
  // Null when unavailable; the same answer on every rank.
  char* mailbox_mine() const { return mbox_mine_; }
  char* mailbox_prev() const { return mailbox_of((rank_ + size_ - 1) % size_); }
  char* mailbox_of(int rank) const { return mbox_of_.empty() ? nullptr : mbox_of_[rank]; }
  // Waits politely in a shared-memory loop: spins, then sleeps in 20 us steps;
  // throws on abort or past the deadline (naming peer).
  void backoff(Clock::time_point start, Clock::time_point deadline, int peer, const char* what);

  static uint64_t p2p_tag(int src, int32_t tag);
  static uint64_t coll_tag(int src, uint64_t seq);

 private:
  void block(Clock::time_point deadline);
  void close_all();
  std::string map_mailbox(size_t bytes);  // packed (address, rkey), "" if UCX cannot
  void attach_mailboxes(const sdk::CommInit& init, bool all_local, const std::vector<std::string>& rkeys);
  [[noreturn]] void fail_timeout(int peer, const char* what) const;

  int rank_;
  int size_;
  std::chrono::microseconds spin_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;
  std::vector<int> peer_ids_;  // error-handler arguments
  ucp_mem_h mbox_memh_ = nullptr;
  std::vector<ucp_rkey_h> rkeys_;
  char* mbox_mine_ = nullptr;
  std::vector<char*> mbox_of_;  // every rank's mailbox, mapped here
  int efd_ = -1;                // the worker's event fd
  int epfd_ = -1;               // epoll over efd_ and wake_fd_
  int wake_fd_ = -1;
  std::atomic<bool> aborted_{false};
};

// Requests of one algorithm step; anything still posted when the step is
// left by an exception is cancelled and released.
class Batch {
 public:
  explicit Batch(Fabric& fabric) : fabric_(fabric) {}
  ~Batch() {
    for (auto& r : reqs) fabric_.discard(r);
  }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  Request& add(Request r) {
    reqs.push_back(r);
    return reqs.back();
  }
  void wait(Clock::time_point deadline, const char* what) {
    fabric_.wait_all(reqs.data(), reqs.size(), deadline, what);
  }
  std::vector<Request> reqs;

 private:
  Fabric& fabric_;
};

// UCX_NET_DEVICES for this job when the user names none: "lo" when every rank
// is on this host, else every interface that is up and not loopback plus every
// RDMA port; "" when UCX_NET_DEVICES is set in the environment.
std::string default_net_devices(const sdk::CommInit& init);

}  // namespace dtrain::ucx_backend
