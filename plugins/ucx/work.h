#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "dtrain/sdk/backend.h"
#include "fabric.h"

namespace dtrain::ucx_backend {

// A point-to-point transfer posted to UCX at submission, completed by
// whoever progresses the worker: its waiter (inline), a test() poll, or the
// op queue's drainer through the communicator's P2pTracker.
class P2pWork : public sdk::PostedWork {
 public:
  P2pWork(std::shared_ptr<Fabric> fabric, Request r, Clock::time_point deadline);
  ~P2pWork() override;
  dt_status_t test() override;
  dt_status_t wait(int64_t timeout_ms) override;
  // Polls the request unless another thread holds it; true when complete.
  bool poll() override;
  void cancel(const std::string& reason) override;

 private:
  void settle_locked();
  std::shared_ptr<Fabric> fabric_;
  std::mutex req_mu_;
  Request req_;
  Clock::time_point deadline_;
};

}  // namespace dtrain::ucx_backend
