#include "communicator.h"

#include <cstring>

#include "work.h"

namespace example {

using dtrain::sdk::bytes_of;

ExampleCommunicator::ExampleCommunicator(const dtrain::sdk::CommInit& init)
    : rank_(init.rank), size_(init.world_size), timeout_ms_(init.timeout_ms), store_(init.store) {
  if (example_keys().read(init.options).verbose)
    dtrain::sdk::Log::info("example backend: rank " + std::to_string(rank_) + " of " + std::to_string(size_));
}

template <typename F>
std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::round(const Opts& o, F&& body) {
  uint64_t id = rounds_++;
  return queue_->submit(
      [this, id, body = std::forward<F>(body)](dtrain::sdk::Clock::time_point deadline) {
        StoreRound r(store_, id, rank_, size_, deadline, aborted_);
        body(r);
        r.finish();
      },
      dtrain::sdk::deadline_after(o.timeout_ms, timeout_ms_));
}

void ExampleCommunicator::reduce_all(const StoreRound& r, void* out, size_t count, int32_t dtype, int32_t op) const {
  std::string acc = r.read(0);
  for (int q = 1; q < size_; ++q) {
    std::string b = r.read(q);
    dtrain::sdk::reduce_into(dtype, op, acc.data(), acc.data(), b.data(), count);
  }
  if (op == DT_OP_AVG) dtrain::sdk::scale_avg(dtype, acc.data(), count, size_);
  if (count) std::memcpy(out, acc.data(), acc.size());
}

std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::allreduce(const Buf& send, const Buf& recv, int32_t op,
                                                                  const Opts& o) {
  return round(o, [this, send, recv, op](const StoreRound& r) {
    r.publish(send.ptr, bytes_of(send));
    reduce_all(r, recv.ptr, recv.count, recv.dtype, op);
  });
}

std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::reduce(const Buf& send, const Buf& recv, int32_t op,
                                                               const Opts& o) {
  int root = o.root;
  return round(o, [this, send, recv, op, root](const StoreRound& r) {
    r.publish(send.ptr, bytes_of(send));
    if (rank_ == root) reduce_all(r, recv.ptr, recv.count, recv.dtype, op);
  });
}

std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::reduce_scatter(const Buf& send, const Buf& recv, int32_t op,
                                                                       const Opts& o) {
  return round(o, [this, send, recv, op](const StoreRound& r) {
    r.publish(send.ptr, bytes_of(send));
    std::vector<char> all(bytes_of(send));
    reduce_all(r, all.data(), send.count, send.dtype, op);
    if (recv.count) std::memcpy(recv.ptr, all.data() + rank_ * bytes_of(recv), bytes_of(recv));
  });
}

std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::broadcast(const Buf& buf, const Opts& o) {
  int root = o.root;
  return round(o, [this, buf, root](const StoreRound& r) {
    if (rank_ == root)
      r.publish(buf.ptr, bytes_of(buf));
    else
      r.publish(nullptr, 0);
    std::string b = r.read(root);
    if (rank_ != root && !b.empty()) std::memcpy(buf.ptr, b.data(), b.size());
  });
}

std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::allgather(const Buf& send, const Buf& recv, const Opts& o) {
  return round(o, [this, send, recv](const StoreRound& r) {
    size_t block = bytes_of(send);
    r.publish(send.ptr, block);
    for (int q = 0; q < size_; ++q) {
      std::string b = r.read(q);
      if (block) std::memcpy(static_cast<char*>(recv.ptr) + q * block, b.data(), block);
    }
  });
}

std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::alltoall(const Buf& send, const Buf& recv, const Opts& o) {
  return round(o, [this, send, recv](const StoreRound& r) {
    size_t block = bytes_of(send) / size_;
    r.publish(send.ptr, bytes_of(send));
    for (int q = 0; q < size_; ++q) {
      std::string b = r.read(q);
      if (block) std::memcpy(static_cast<char*>(recv.ptr) + q * block, b.data() + rank_ * block, block);
    }
  });
}

std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::barrier(const Opts& o) {
  return round(o, [this](const StoreRound& r) {
    r.publish(nullptr, 0);
    for (int q = 0; q < size_; ++q) r.read(q);
  });
}

std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::send(const Buf& buf, int32_t peer, const Opts& o) {
  uint64_t n = sent_[{peer, o.tag}]++;
  store_.set("p2p/" + std::to_string(rank_) + "/" + std::to_string(peer) + "/" + std::to_string(o.tag) + "/" +
                 std::to_string(n),
             std::string(static_cast<const char*>(buf.ptr), bytes_of(buf)));
  return done();
}

std::shared_ptr<dtrain::sdk::Work> ExampleCommunicator::recv(const Buf& buf, int32_t peer, const Opts& o) {
  uint64_t n = received_[{peer, o.tag}]++;
  std::string key = "p2p/" + std::to_string(peer) + "/" + std::to_string(rank_) + "/" + std::to_string(o.tag) + "/" +
                    std::to_string(n);
  return queue_->submit(
      [this, buf, key](dtrain::sdk::Clock::time_point deadline) {
        std::string b = get_until(store_, key, deadline, aborted_);
        if (b.size() != bytes_of(buf))
          dtrain::sdk::fail(DT_ERR_INVALID_USAGE, "recv of " + std::to_string(bytes_of(buf)) +
                                                      " bytes matched a send of " + std::to_string(b.size()) +
                                                      " bytes");
        if (!b.empty()) std::memcpy(buf.ptr, b.data(), b.size());
        store_.remove(key);
      },
      dtrain::sdk::deadline_after(o.timeout_ms, timeout_ms_));
}

}  // namespace example
