// All-reduce and its relatives (reduce, reduce-scatter): the size-based choice
// between the small-message algorithms and the ring.
#include "algorithms.h"

namespace dtrain::ucx_backend {

void Algorithms::allreduce(const void* src, void* dst, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                           Clock::time_point deadline) {
  size_t esz = sdk::dtype_size(dtype);
  if (count == 0) return;
  if (world() == 1 || !use_ring(count, esz)) {
    if (src != dst) std::memcpy(dst, src, count * esz);
    if (world() > 1) small_allreduce(dst, count, dtype, op, seq, deadline);
  } else {
    size_t bytes = count * esz;
    bool adapt = settings.adaptive_stream && shm_ok(bytes) && !stream_ok(bytes);
    bool stream = adapt ? store_choice_.pick() : stream_ok(bytes);
    auto start = Clock::now();
    ring_reduce_scatter(src, dst, nullptr, count, dtype, op, seq, deadline, stream);
    ring_allgather(dst, count, esz, seq, deadline, stream);
    if (adapt) store_choice_.learn(stream, bytes, Clock::now() - start);
  }
  if (op == DT_OP_AVG) sdk::scale_avg(dtype, dst, count, world());
}

void Algorithms::small_allreduce(void* buf, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                                 Clock::time_point deadline) {
  size_t bytes = count * sdk::dtype_size(dtype);
  if (settings.shm && fabric_->mailbox_mine() && world() <= MailboxLayout::kMaxFlatRanks &&
      bytes <= settings.small_bytes)
    flat_allreduce(buf, count, dtype, op, deadline);
  else
    recursive_doubling(buf, count, dtype, op, seq, deadline);
}

void Algorithms::flat_allreduce(void* buf, size_t count, int32_t dtype, int32_t op, Clock::time_point deadline) {
  size_t bytes = count * sdk::dtype_size(dtype);
  sdk::ReduceFn fn = sdk::reduce_fn(dtype, op);
  uint64_t k = small_ops_++;
  bool tiny = bytes <= MailboxLayout::kTinyBytes;
  size_t at_k = tiny ? MailboxLayout::tiny_at(k)
                     : MailboxLayout::small_at(settings.chunk_bytes, settings.depth, settings.small_bytes,
                                               static_cast<int>(k % 2));
  size_t seq_at = tiny ? at_k + MailboxLayout::kTinySeq : MailboxLayout::kSeq;
  char* mine = fabric_->mailbox_mine();
  // No wait before writing: see MailboxLayout (every peer is done with the
  // buffer of op k - 2 since it published op k - 1, which this rank has read).
  std::memcpy(mine + at_k, buf, bytes);
  counter(mine, seq_at).store(k + 1, std::memory_order_release);
  Clock::time_point start{};
  for (int p = 0; p < world(); ++p) {
    if (p == rank()) continue;
    auto& c = counter(fabric_->mailbox_of(p), seq_at);
    for (unsigned i = 1; c.load(std::memory_order_acquire) < k + 1; ++i) {
      if ((i & 63) != 0) continue;
      if (start == Clock::time_point{}) start = Clock::now();
      fabric_->backoff(start, deadline, p, "allreduce");
    }
  }
  if (world() == 2) {
    // buf still holds this rank's data: reduce it with the peer's in rank order.
    const char* peer = fabric_->mailbox_of(1 - rank()) + at_k;
    fn(buf, rank() == 0 ? buf : peer, rank() == 0 ? peer : buf, count);
  } else {
    fn(buf, fabric_->mailbox_of(0) + at_k, fabric_->mailbox_of(1) + at_k, count);
    for (int p = 2; p < world(); ++p) fn(buf, buf, fabric_->mailbox_of(p) + at_k, count);
  }
}

void Algorithms::recursive_doubling(void* buf, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                                    Clock::time_point deadline) {
  size_t bytes = count * sdk::dtype_size(dtype);
  sdk::ReduceFn fn = sdk::reduce_fn(dtype, op);
  char* tmp = grow(small_, bytes);
  int p2 = 1;
  while (p2 * 2 <= world()) p2 *= 2;
  int extra = world() - p2, r = rank();
  uint64_t my_tag = Fabric::coll_tag(r, seq);
  if (r >= p2) {
    Batch b(fabric());
    b.add(fabric().isend(r - p2, my_tag, buf, bytes));
    b.add(fabric().irecv(r - p2, Fabric::coll_tag(r - p2, seq), buf, bytes));
    b.wait(deadline, "allreduce");
    return;
  }
  if (r < extra) {
    Batch b(fabric());
    b.add(fabric().irecv(r + p2, Fabric::coll_tag(r + p2, seq), tmp, bytes));
    b.wait(deadline, "allreduce");
    fn(buf, buf, tmp, count);
  }
  for (int mask = 1; mask < p2; mask <<= 1) {
    int partner = r ^ mask;
    Batch b(fabric());
    b.add(fabric().irecv(partner, Fabric::coll_tag(partner, seq), tmp, bytes));
    b.add(fabric().isend(partner, my_tag, buf, bytes));
    b.wait(deadline, "allreduce");
    fn(buf, buf, tmp, count);
  }
  if (r < extra) {
    Batch b(fabric());
    b.add(fabric().isend(r + p2, my_tag, buf, bytes));
    b.wait(deadline, "allreduce");
  }
}

void Algorithms::reduce_scatter(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                                Clock::time_point deadline) {
  size_t esz = sdk::dtype_size(dtype), total = count * world();
  if (world() == 1 || !use_ring(total, esz)) {
    char* tmp = grow(full_, total * esz);
    std::memcpy(tmp, send, total * esz);
    if (world() > 1) small_allreduce(tmp, total, dtype, op, seq, deadline);
    std::memcpy(recv, tmp + rank() * count * esz, count * esz);
  } else {
    char* acc = grow(full_, total * esz);
    ring_reduce_scatter(send, acc, recv, total, dtype, op, seq, deadline, stream_ok(total * esz));
  }
  if (op == DT_OP_AVG) sdk::scale_avg(dtype, recv, count, world());
}

void Algorithms::reduce(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, int root, uint64_t seq,
                        Clock::time_point deadline) {
  size_t esz = sdk::dtype_size(dtype), bytes = count * esz;
  bool is_root = rank() == root;
  if (world() == 1 || !use_ring(count, esz)) {
    char* tmp = grow(full_, bytes);
    std::memcpy(tmp, send, bytes);
    if (world() > 1) small_allreduce(tmp, count, dtype, op, seq, deadline);
    if (is_root) std::memcpy(recv, tmp, bytes);
  } else {
    void* acc = is_root ? recv : grow(full_, bytes);
    ring_reduce_scatter(send, acc, nullptr, count, dtype, op, seq, deadline, stream_ok(bytes));
    Batch b(fabric());
    if (is_root) {
      for (int p = 0; p < world(); ++p)
        if (p != root)
          b.add(fabric().irecv(p, Fabric::coll_tag(p, seq), at(recv, block_off(count, p) * esz),
                               block_len(count, p) * esz));
    } else {
      b.add(fabric().isend(root, Fabric::coll_tag(rank(), seq), at(acc, block_off(count, rank()) * esz),
                           block_len(count, rank()) * esz));
    }
    b.wait(deadline, "reduce");
  }
  if (is_root && op == DT_OP_AVG) sdk::scale_avg(dtype, recv, count, world());
}

}  // namespace dtrain::ucx_backend
