#include "communicator.h"

namespace dtrain::ucx_backend {

UcxCommunicator::UcxCommunicator(const sdk::CommInit& init) : timeout_ms_(init.timeout_ms) {
  UcxOptions opts = UcxOptions::parse(init);
  const Settings& s = opts.settings;
  fabric_ = std::make_shared<Fabric>(init, opts.tls, opts.net_devices, opts.errors, s.spin,
                                     s.shm ? MailboxLayout::bytes(s.chunk_bytes, s.depth, s.small_bytes) : 0,
                                     opts.fingerprint());
  algorithms_ = std::make_shared<Algorithms>(fabric_, s);
  sdk::OpQueue::Settings q;
  q.interruptible = true;
  q.grace = opts.grace;
  q.poll = std::max(q.grace, std::chrono::microseconds(1000));
  q.idle_hook = [this] { progress_p2p(); };
  queue_ = sdk::OpQueue::create(std::move(q));
}

UcxCommunicator::~UcxCommunicator() {
  abort("communicator destroyed");
  queue_->shutdown("communicator destroyed");
}

void UcxCommunicator::abort(const std::string& reason) {
  if (aborted_.exchange(true)) return;
  fabric_->abort();
  queue_->abort(reason);
  p2p_.abort(reason);
}

void UcxCommunicator::progress_p2p() {
  if (p2p_.empty()) return;
  while (fabric_->progress()) {
  }
  p2p_.progress();
}

template <typename F>
std::shared_ptr<sdk::Work> UcxCommunicator::enqueue(const Opts& o, F&& body) {
  if (aborted_.load()) sdk::fail(DT_ERR_ABORTED, "ucx: communicator aborted");
  uint64_t seq = coll_seq_++;
  // The queue is interruptible: shutdown() (in the destructor, before the
  // members go) waits until no body runs, so a body may hold a plain pointer.
  auto run = [a = algorithms_.get(), seq, body = std::forward<F>(body)](Clock::time_point deadline) mutable {
    body(*a, seq, deadline);
  };
  auto deadline = sdk::deadline_after(o.timeout_ms, timeout_ms_);
  // A caller that blocks on the op at once: run it here when the queue is idle.
  if (o.flags & DT_CALL_WAIT) return queue_->run_or_submit(std::move(run), deadline);
  return queue_->submit(std::move(run), deadline);
}

std::shared_ptr<sdk::Work> UcxCommunicator::allreduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) {
  sdk::require_cpu(send, recv, "ucx");
  sdk::reduce_fn(recv.dtype, op);  // refuses unknown codes at submission
  return enqueue(o, [send, recv, op](Algorithms& a, uint64_t seq, Clock::time_point d) {
    a.allreduce(send.ptr, recv.ptr, recv.count, recv.dtype, op, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::broadcast(const Buf& buf, const Opts& o) {
  sdk::require_cpu(buf, "ucx");
  int root = o.root;
  return enqueue(o, [buf, root](Algorithms& a, uint64_t seq, Clock::time_point d) {
    size_t bytes = sdk::bytes_of(buf);
    if (bytes && a.world() > 1) a.broadcast(buf.ptr, bytes, root, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::allgather(const Buf& send, const Buf& recv, const Opts& o) {
  sdk::require_cpu(send, recv, "ucx");
  return enqueue(o, [send, recv](Algorithms& a, uint64_t seq, Clock::time_point d) {
    size_t bytes = sdk::bytes_of(send);
    if (bytes) a.allgather(send.ptr, recv.ptr, bytes, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::reduce_scatter(const Buf& send, const Buf& recv, int32_t op,
                                                           const Opts& o) {
  sdk::require_cpu(send, recv, "ucx");
  sdk::reduce_fn(recv.dtype, op);
  return enqueue(o, [send, recv, op](Algorithms& a, uint64_t seq, Clock::time_point d) {
    if (recv.count) a.reduce_scatter(send.ptr, recv.ptr, recv.count, recv.dtype, op, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::reduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) {
  sdk::require_cpu(send, "ucx");
  sdk::reduce_fn(send.dtype, op);
  int root = o.root;
  return enqueue(o, [send, recv, op, root](Algorithms& a, uint64_t seq, Clock::time_point d) {
    if (send.count) a.reduce(send.ptr, recv.ptr, send.count, send.dtype, op, root, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::alltoall(const Buf& send, const Buf& recv, const Opts& o) {
  sdk::require_cpu(send, recv, "ucx");
  return enqueue(o, [send, recv](Algorithms& a, uint64_t seq, Clock::time_point d) {
    size_t bytes = sdk::bytes_of(send);
    if (bytes) a.alltoall(send.ptr, recv.ptr, bytes, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::barrier(const Opts& o) {
  return enqueue(o, [](Algorithms& a, uint64_t seq, Clock::time_point d) {
    if (a.world() > 1) a.barrier(seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::post(const Buf& buf, int32_t peer, const Opts& o, bool is_send) {
  sdk::require_cpu(buf, "ucx");
  if (aborted_.load()) sdk::fail(DT_ERR_ABORTED, "ucx: communicator aborted");
  if (peer < 0 || peer >= fabric_->size() || peer == fabric_->rank())
    sdk::fail(DT_ERR_INVALID_USAGE, "ucx: invalid peer rank " + std::to_string(peer));
  size_t bytes = sdk::bytes_of(buf);
  Request r = is_send ? fabric_->isend(peer, Fabric::p2p_tag(fabric_->rank(), o.tag), buf.ptr, bytes)
                      : fabric_->irecv(peer, Fabric::p2p_tag(peer, o.tag), buf.ptr, bytes);
  auto w = std::make_shared<P2pWork>(fabric_, r, sdk::deadline_after(o.timeout_ms, timeout_ms_));
  if (w->Work::test() == DT_IN_PROGRESS) p2p_.add(w);
  return w;
}

std::shared_ptr<sdk::Work> UcxCommunicator::send(const Buf& buf, int32_t peer, const Opts& o) {
  return post(buf, peer, o, true);
}

std::shared_ptr<sdk::Work> UcxCommunicator::recv(const Buf& buf, int32_t peer, const Opts& o) {
  return post(buf, peer, o, false);
}

}  // namespace dtrain::ucx_backend
