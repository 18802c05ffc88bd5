#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "dtrain/sdk/backend.h"
#include "work.h"

namespace dtrain::ucx_backend {

enum class Algorithm { Auto, RecursiveDoubling, Ring };
// Peer-failure handling of endpoints: auto = only to peers on other hosts.
enum class ErrorHandling { Auto, Peer, None };

struct Settings {
  Algorithm algorithm = Algorithm::Auto;
  size_t small_bytes = 8 * 1024;    // auto: recursive doubling up to here, ring above
  size_t chunk_bytes = 128 * 1024;  // ring pipeline chunk
  int depth = 8;                    // chunks in flight per ring step
  std::chrono::microseconds spin{2000};
  bool shm = true;  // shared-memory mailboxes for large messages on one host
};

// Layout of a shared-memory mailbox. Ring part: two counters on their own
// cache lines, then Settings::depth slots of Settings::chunk_bytes; the owner
// writes chunk k into slot k % depth and publishes head = k + 1, the reader
// (the next rank) reads it and publishes tail = k + 1. Small part (flat
// all-reduce of up to kMaxFlatRanks ranks): the owner publishes its data for
// small op k in buffer k % 2 and sets seq = k + 1; every reader p then sets
// ack[p] = k + 1 here. Counters only grow, across collectives, since every
// rank runs the same sequence of ops.
struct MailboxLayout {
  static constexpr int kMaxFlatRanks = 16;
  static constexpr size_t kHead = 0;
  static constexpr size_t kTail = 128;
  static constexpr size_t kSeq = 256;
  static constexpr size_t kAck = 384;  // + 64 * reader rank
  static constexpr size_t kRing = 4096;
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
  int efd_ = -1;    // the worker's event fd
  int epfd_ = -1;   // epoll over efd_ and wake_fd_
  int wake_fd_ = -1;
  std::atomic<bool> aborted_{false};
};

// A posted point-to-point transfer: posted at submission (so any order of
// sends and receives between ranks works), completed by whoever progresses.
class P2pWork : public sdk::Work {
 public:
  P2pWork(std::shared_ptr<Fabric> fabric, Request r, Clock::time_point deadline);
  ~P2pWork() override;
  dt_status_t test() override;
  dt_status_t wait(int64_t timeout_ms) override;
  void fail_aborted(const std::string& reason);
  // Polls the request unless another thread holds it; true when finished.
  bool poke();

 private:
  void settle_locked();
  std::shared_ptr<Fabric> fabric_;
  std::mutex req_mu_;
  Request req_;
  Clock::time_point deadline_;
};

class UcxCommunicator : public sdk::Communicator {
 public:
  explicit UcxCommunicator(const sdk::CommInit& init);
  ~UcxCommunicator() override;

  std::shared_ptr<sdk::Work> allreduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) override;
  std::shared_ptr<sdk::Work> broadcast(const Buf& buf, const Opts& o) override;
  std::shared_ptr<sdk::Work> allgather(const Buf& send, const Buf& recv, const Opts& o) override;
  std::shared_ptr<sdk::Work> reduce_scatter(const Buf& send, const Buf& recv, int32_t op, const Opts& o) override;
  std::shared_ptr<sdk::Work> reduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) override;
  std::shared_ptr<sdk::Work> alltoall(const Buf& send, const Buf& recv, const Opts& o) override;
  std::shared_ptr<sdk::Work> barrier(const Opts& o) override;
  std::shared_ptr<sdk::Work> send(const Buf& buf, int32_t peer, const Opts& o) override;
  std::shared_ptr<sdk::Work> recv(const Buf& buf, int32_t peer, const Opts& o) override;
  void abort(const std::string& reason) override;

  // The algorithms; they run on one thread at a time (the op queue's runner).
  struct Engine;

 private:
  template <typename F>
  std::shared_ptr<sdk::Work> enqueue(const Opts& o, F&& body);
  Clock::time_point deadline_of(const Opts& o) const;
  std::shared_ptr<sdk::Work> post(const Buf& buf, int32_t peer, const Opts& o, bool is_send);
  void progress_p2p();

  int64_t timeout_ms_;
  std::shared_ptr<Fabric> fabric_;
  std::shared_ptr<Engine> engine_;
  uint64_t coll_seq_ = 0;
  std::atomic<bool> aborted_{false};
  std::mutex p2p_mu_;
  std::list<std::weak_ptr<P2pWork>> p2p_;
  std::shared_ptr<OpQueue> queue_;
};

}  // namespace dtrain::ucx_backend
