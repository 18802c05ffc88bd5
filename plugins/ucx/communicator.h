#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "algorithms.h"
#include "dtrain/sdk/backend.h"
#include "dtrain/sdk/p2p.h"
#include "fabric.h"
#include "options.h"
#include "work.h"

namespace dtrain::ucx_backend {

// One UCX fabric per communicator. Collectives run in order on the SDK's
// OpQueue, inline on the thread that waits for them (UCX's progress loops
// return on abort and at any deadline they are given, so the queue is
// interruptible); point-to-point transfers are posted at submission and
// completed by their waiter or, through the P2pTracker, by the queue's drainer.
class UcxCommunicator : public sdk::Communicator {
 public:
  explicit UcxCommunicator(const sdk::CommInit& init);
  ~UcxCommunicator() override;

  DTRAIN_SDK_COMMUNICATOR_OPS;

 private:
  template <typename F>
  std::shared_ptr<sdk::Work> enqueue(const Opts& o, F&& body);
  std::shared_ptr<sdk::Work> post(const Buf& buf, int32_t peer, const Opts& o, bool is_send);
  void progress_p2p();

  int64_t timeout_ms_;
  std::shared_ptr<Fabric> fabric_;
  std::shared_ptr<Algorithms> algorithms_;
  uint64_t coll_seq_ = 0;
  std::atomic<bool> aborted_{false};
  sdk::P2pTracker p2p_{sdk::P2pTracker::Mode::Poll};
  std::shared_ptr<sdk::OpQueue> queue_;
};

}  // namespace dtrain::ucx_backend
