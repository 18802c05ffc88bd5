#pragma once
// The UCX plugin's collective algorithms over its Fabric: recursive doubling
// and a flat shared-memory exchange for small messages (allreduce.cc), a
// pipelined ring for large ones (ring.cc), and the data-movement collectives
// (exchange.cc). One instance per communicator; its methods run on one thread
// at a time (the op queue's runner), in the same order on every rank.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "fabric.h"
#include "options.h"

namespace dtrain::ucx_backend {

inline char* at(void* p, size_t off) { return static_cast<char*>(p) + off; }

// memcpy with non-temporal stores (the lines go to memory, not into this
// core's cache); ends with a store fence, so a release store after it
// publishes the data.
void copy_streaming(char* dst, const char* src, size_t len);
inline const char* at(const void* p, size_t off) { return static_cast<const char*>(p) + off; }

class Algorithms {
 public:
  Algorithms(std::shared_ptr<Fabric> fabric, const Settings& settings)
      : settings(settings), fabric_(std::move(fabric)) {}

  int world() const { return fabric_->size(); }
  int rank() const { return fabric_->rank(); }

  void allreduce(const void* src, void* dst, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                 Clock::time_point deadline);
  void broadcast(void* buf, size_t bytes, int root, uint64_t seq, Clock::time_point deadline);
  void allgather(const void* send, void* recv, size_t bytes, uint64_t seq, Clock::time_point deadline);
  void reduce_scatter(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                      Clock::time_point deadline);
  void reduce(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, int root, uint64_t seq,
              Clock::time_point deadline);
  void alltoall(const void* send, void* recv, size_t bytes, uint64_t seq, Clock::time_point deadline);
  void barrier(uint64_t seq, Clock::time_point deadline);

  const Settings settings;

 private:
  bool shm_ok(size_t bytes) const { return settings.shm && fabric_->mailbox_prev() && bytes > settings.small_bytes; }
  bool stream_ok(size_t bytes) const { return settings.stream_bytes > 0 && bytes >= settings.stream_bytes; }

  // Plain or non-temporal mailbox stores for a ring all-reduce below
  // stream_bytes, whichever has taken less time per byte lately (this VM
  // moves dirty lines between its vCPUs at 12 GB/s in one placement and 3 in
  // another, where streaming holds 6-7): the loser is retried every
  // kProbeEvery ops. A rank's own choice, like stream_ok().
  class StoreChoice {
   public:
    static constexpr uint64_t kProbeEvery = 32;
    bool pick() {
      ++ops_;
      if (ns_[0] == 0) return false;
      if (ns_[1] == 0) return true;
      bool best = ns_[1] < ns_[0];
      return ops_ % kProbeEvery == 0 ? !best : best;
    }
    void learn(bool stream, size_t bytes, Clock::duration took) {
      double x = std::chrono::duration<double, std::nano>(took).count() / static_cast<double>(bytes);
      double& e = ns_[stream ? 1 : 0];
      e = e == 0 ? x : 0.5 * e + 0.5 * x;
    }

   private:
    double ns_[2] = {0, 0};  // moving average of ns per byte: plain, streaming
    uint64_t ops_ = 0;
  };

  static std::atomic<uint64_t>& counter(char* box, size_t off) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(box + off);
  }

  // One ring step over the mailboxes: streams [sptr, sptr + sbytes) to the
  // next rank in chunks while handing each chunk of the previous rank's
  // stream (rbytes in all) to take(k, data, bytes) as soon as it is there.
  // stream: write the mailbox with non-temporal stores (see
  // Settings::stream_bytes).
  template <typename Take>
  void shm_step(const char* sptr, size_t sbytes, size_t rbytes, size_t chunk_bytes, Take&& take,
                Clock::time_point deadline, const char* what, bool stream) {
    char* mine = fabric_->mailbox_mine();
    char* prev = fabric_->mailbox_prev();
    size_t depth = static_cast<size_t>(settings.depth);
    size_t slot = settings.chunk_bytes;
    auto& my_head = counter(mine, MailboxLayout::kHead);
    auto& my_tail = counter(mine, MailboxLayout::kTail);
    auto& prev_head = counter(prev, MailboxLayout::kHead);
    auto& prev_tail = counter(prev, MailboxLayout::kTail);
    size_t nsend = (sbytes + chunk_bytes - 1) / chunk_bytes, nrecv = (rbytes + chunk_bytes - 1) / chunk_bytes;
    size_t i = 0, j = 0;
    auto start = Clock::now();
    unsigned idle = 0;
    while (i < nsend || j < nrecv) {
      bool moved = false;
      if (i < nsend && produced_ - my_tail.load(std::memory_order_acquire) < depth) {
        size_t len = std::min(chunk_bytes, sbytes - i * chunk_bytes);
        char* to = mine + MailboxLayout::kRing + (produced_ % depth) * slot;
        if (stream)
          copy_streaming(to, sptr + i * chunk_bytes, len);
        else
          std::memcpy(to, sptr + i * chunk_bytes, len);
        my_head.store(++produced_, std::memory_order_release);
        ++i;
        moved = true;
      }
      if (j < nrecv && prev_head.load(std::memory_order_acquire) > consumed_) {
        size_t len = std::min(chunk_bytes, rbytes - j * chunk_bytes);
        take(j, prev + MailboxLayout::kRing + (consumed_ % depth) * slot, len);
        prev_tail.store(++consumed_, std::memory_order_release);
        ++j;
        moved = true;
      }
      if (moved) {
        idle = 0;
        start = Clock::now();
      } else if ((++idle & 63) == 0) {
        fabric_->backoff(start, deadline, j < nrecv ? wrap(rank() - 1) : wrap(rank() + 1), what);
      }
    }
  }
  static char* grow(std::vector<char>& v, size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
  }

  // Block b of `count` elements split over n ranks: offset and length in elements.
  size_t block_off(size_t count, int b) const {
    size_t base = count / world(), rem = count % world();
    return b * base + std::min<size_t>(b, rem);
  }
  size_t block_len(size_t count, int b) const {
    size_t base = count / world(), rem = count % world();
    return base + (static_cast<size_t>(b) < rem ? 1 : 0);
  }
  int wrap(int x) const { return ((x % world()) + world()) % world(); }

  bool use_ring(size_t count, size_t esz) const {
    if (count < static_cast<size_t>(world())) return false;
    if (settings.algorithm == Algorithm::Ring) return true;
    if (settings.algorithm == Algorithm::RecursiveDoubling) return false;
    return count * esz > settings.small_bytes;
  }

  // In-place all-reduce of a small buffer: flat through the mailboxes when
  // every rank is on this host, else recursive doubling over tag messages.
  void small_allreduce(void* buf, size_t count, int32_t dtype, int32_t op, uint64_t seq, Clock::time_point deadline);

  // Every rank publishes its data in its mailbox, then reduces all ranks'
  // data in rank order (the same result everywhere) and acknowledges.
  void flat_allreduce(void* buf, size_t count, int32_t dtype, int32_t op, Clock::time_point deadline);

  void recursive_doubling(void* buf, size_t count, int32_t dtype, int32_t op, uint64_t seq, Clock::time_point deadline);

  // Ring reduce-scatter over blocks of `count`: afterwards dst holds this
  // rank's fully reduced block (block rank()), written to final_dst instead
  // when given. src is this rank's input (may equal dst); other blocks of
  // dst are used as accumulators. Each step's block moves in chunks, and
  // every chunk is reduced as soon as it lands, while later ones are in flight.
  // stream: write the mailboxes with non-temporal stores.
  void ring_reduce_scatter(const void* src, void* dst, void* final_dst, size_t count, int32_t dtype, int32_t op,
                           uint64_t seq, Clock::time_point deadline, bool stream);

  // Ring all-gather of the blocks of `count` in place in buf, starting from
  // this rank's block.
  void ring_allgather(void* buf, size_t count, size_t esz, uint64_t seq, Clock::time_point deadline, bool stream);

  Fabric& fabric() { return *fabric_; }

  std::shared_ptr<Fabric> fabric_;
  std::vector<char> chunks_;  // ring pipeline slots
  std::vector<char> full_;    // whole-buffer scratch
  std::vector<char> small_;   // recursive doubling partner data
  uint64_t produced_ = 0;     // chunks written to our mailbox, ever
  uint64_t consumed_ = 0;     // chunks read from the previous rank's mailbox, ever
  uint64_t small_ops_ = 0;    // flat all-reduces, ever
  StoreChoice store_choice_;
};

}  // namespace dtrain::ucx_backend
