// Data-movement collectives: broadcast (binomial tree), all-gather (ring),
// all-to-all (pairwise), barrier (dissemination).
#include "algorithms.h"

namespace dtrain::ucx_backend {

void Algorithms::broadcast(void* buf, size_t bytes, int root, uint64_t seq, Clock::time_point deadline) {
  int vr = wrap(rank() - root);
  int mask = 1;
  while (mask < world()) {
    if (vr & mask) {
      int src = wrap(vr - mask + root);
      Batch b(fabric());
      b.add(fabric().irecv(src, Fabric::coll_tag(src, seq), buf, bytes));
      b.wait(deadline, "broadcast");
      break;
    }
    mask <<= 1;
  }
  Batch b(fabric());
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < world()) b.add(fabric().isend(wrap(vr + mask + root), Fabric::coll_tag(rank(), seq), buf, bytes));
  b.wait(deadline, "broadcast");
}

void Algorithms::allgather(const void* send, void* recv, size_t bytes, uint64_t seq, Clock::time_point deadline) {
  char* mine = at(recv, rank() * bytes);
  if (send != mine) std::memmove(mine, send, bytes);
  if (world() > 1) ring_allgather(recv, bytes * world(), 1, seq, deadline, stream_ok(bytes * world()));
}

void Algorithms::alltoall(const void* send, void* recv, size_t bytes, uint64_t seq, Clock::time_point deadline) {
  size_t blk = bytes / world();
  const void* in = send;
  if (send == recv) {
    char* tmp = grow(full_, bytes);
    std::memcpy(tmp, send, bytes);
    in = tmp;
  }
  Batch b(fabric());
  for (int i = 1; i < world(); ++i) {
    int from = wrap(rank() - i);
    b.add(fabric().irecv(from, Fabric::coll_tag(from, seq), at(recv, from * blk), blk));
  }
  for (int i = 1; i < world(); ++i) {
    int to = wrap(rank() + i);
    b.add(fabric().isend(to, Fabric::coll_tag(rank(), seq), at(in, to * blk), blk));
  }
  std::memcpy(at(recv, rank() * blk), at(in, rank() * blk), blk);
  b.wait(deadline, "alltoall");
}

void Algorithms::barrier(uint64_t seq, Clock::time_point deadline) {
  for (int k = 1; k < world(); k <<= 1) {
    int to = wrap(rank() + k), from = wrap(rank() - k);
    Batch b(fabric());
    b.add(fabric().irecv(from, Fabric::coll_tag(from, seq), nullptr, 0));
    b.add(fabric().isend(to, Fabric::coll_tag(rank(), seq), nullptr, 0));
    b.wait(deadline, "barrier");
  }
}

}  // namespace dtrain::ucx_backend
