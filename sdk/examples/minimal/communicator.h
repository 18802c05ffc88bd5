#pragma once

#include <atomic>
#include <map>
#include <utility>

#include "dtrain/sdk/backend.h"

namespace example {

// The [example] keys as the job file sets them; the initializers are the
// defaults. Each key is declared once, with its bound (if any) and doc, in
// example_keys() (plugin.cc), which reads them all.
struct ExampleKeys {
  bool verbose = false;
};
const dtrain::sdk::ConfigTable<ExampleKeys>& example_keys();

// Every collective is a round of blobs through the core's rendezvous store:
// slow, but correct for any world size, and it needs nothing but the SDK.
class ExampleCommunicator : public dtrain::sdk::Communicator {
 public:
  explicit ExampleCommunicator(const dtrain::sdk::CommInit& init);
  ~ExampleCommunicator() override {
    abort("communicator destroyed");
    queue_->shutdown("communicator destroyed");
  }

  std::shared_ptr<dtrain::sdk::Work> allreduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) override;
  std::shared_ptr<dtrain::sdk::Work> broadcast(const Buf& buf, const Opts& o) override;
  std::shared_ptr<dtrain::sdk::Work> allgather(const Buf& send, const Buf& recv, const Opts& o) override;
  std::shared_ptr<dtrain::sdk::Work> reduce_scatter(const Buf& send, const Buf& recv, int32_t op,
                                                    const Opts& o) override;
  std::shared_ptr<dtrain::sdk::Work> reduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) override;
  std::shared_ptr<dtrain::sdk::Work> alltoall(const Buf& send, const Buf& recv, const Opts& o) override;
  std::shared_ptr<dtrain::sdk::Work> barrier(const Opts& o) override;
  std::shared_ptr<dtrain::sdk::Work> send(const Buf& buf, int32_t peer, const Opts& o) override;
  std::shared_ptr<dtrain::sdk::Work> recv(const Buf& buf, int32_t peer, const Opts& o) override;
  void abort(const std::string& reason) override {
    aborted_.store(true, std::memory_order_release);
    queue_->abort(reason);
  }

 private:
  template <typename F>
  std::shared_ptr<dtrain::sdk::Work> round(const Opts& o, F&& body);
  // Reduces every rank's blob into out (count elements of dtype).
  void reduce_all(const class StoreRound& r, void* out, size_t count, int32_t dtype, int32_t op) const;

  int rank_;
  int size_;
  int64_t timeout_ms_;
  dtrain::sdk::Store store_;
  uint64_t rounds_ = 0;
  std::map<std::pair<int, int>, uint64_t> sent_, received_;  // (peer, tag) -> messages
  std::atomic<bool> aborted_{false};
  // The SDK's op queue: ops run in order, inline on the thread that waits
  // for them. Every store wait is cut into short slices that honour the
  // op's deadline and an abort (get_until), so the queue is interruptible.
  std::shared_ptr<dtrain::sdk::OpQueue> queue_ = dtrain::sdk::OpQueue::create({/*interruptible=*/true});
};

}  // namespace example
