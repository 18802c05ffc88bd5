#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dtrain/sdk/backend.h"

namespace dtrain::nccl_backend {

// Throws sdk::Error(DT_ERR_SYSTEM) naming what and CUDA's message unless st is
// cudaSuccess (and clears CUDA's last error either way).
void check_cuda(cudaError_t st, const std::string& what);
// The dt status an NCCL result maps to.
dt_status_t status_of(ncclResult_t r);

// The NCCL side of one communicator, shared by the communicator and every work
// it made, so a work released after the communicator still polls a live
// handle. Thread-safe. After abort() the ncclComm_t is gone: every NCCL call
// on it goes through poll_async_error(), which checks first.
class NcclState {
 public:
  NcclState(ncclComm_t comm, int device, int rank, int world_size)
      : comm_(comm), device_(device), rank_(rank), world_size_(world_size) {}
  ~NcclState();
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;

  int device() const { return device_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Runs f(comm) -> ncclResult_t under the lock abort() takes, so the
  // communicator cannot be aborted (freed) during the call; f makes only
  // nonblocking NCCL calls. Throws DT_ERR_ABORTED after an abort; on an NCCL
  // error sets *last_error to ncclGetLastError.
  template <typename F>
  ncclResult_t call(F&& f, std::string* last_error) {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.load(std::memory_order_acquire) || comm_ == nullptr)
      sdk::fail(DT_ERR_ABORTED, "nccl: the communicator was aborted: " + abort_reason());
    ncclResult_t r = f(comm_);
    if (r != ncclSuccess && r != ncclInProgress && last_error) *last_error = ncclGetLastError(comm_);
    return r;
  }

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const;
  // The first asynchronous error NCCL reported, "" while there is none.
  std::string failure() const;

  // ncclSuccess, ncclInProgress, or the communicator's asynchronous error
  // (which poisons it: failure() then says what happened). Never blocks on an
  // abort in progress: returns ncclInProgress instead (the caller checks
  // aborted() next round). Sets *message on an error.
  ncclResult_t poll_async_error(std::string* message);

  // ncclCommAbort, once; any thread; later polls see aborted().
  void abort(const std::string& reason);

 private:
  std::mutex mu_;  // held around every NCCL call on comm_ made here
  ncclComm_t comm_;
  int device_, rank_, world_size_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex info_mu_;  // never held across an NCCL call
  std::string abort_reason_;
  std::string failure_;
};

// How long wait() pauses between polls after `elapsed` of waiting: none (it
// yields and polls again) for the first 5 ms, as cudaStreamSynchronize spins,
// so small and mid-size ops are seen done at once; then elapsed / 100, at most
// 1 ms. A completion is seen at most ~1% of the op's time (plus the system's
// sleep granularity) late, so dtrain's per-op time stays within a few percent
// of a spinning waiter's (dtrain-bench collectives --backend nccl).
inline std::chrono::microseconds poll_pause(std::chrono::nanoseconds elapsed) {
  if (elapsed < std::chrono::milliseconds(5)) return std::chrono::microseconds(0);
  return std::min<std::chrono::microseconds>(std::chrono::milliseconds(1),
                                             std::chrono::duration_cast<std::chrono::microseconds>(elapsed / 100));
}

// A work whose wait() polls test() with poll_pause() between polls (a CUDA
// event has no wakeup that an abort could also trigger).
class PolledWork : public sdk::Work {
 public:
  dt_status_t wait(int64_t timeout_ms) override;
};

// A work backed by a CUDA event recorded on the op's stream right after the
// op was enqueued. test() polls the abort flag, the event, then NCCL's
// asynchronous error.
class EventWork : public PolledWork {
 public:
  // Records a new event on stream; what names the op in messages.
  EventWork(std::shared_ptr<NcclState> state, cudaStream_t stream, std::string what);
  ~EventWork() override;
  dt_status_t test() override;

 private:
  std::shared_ptr<NcclState> state_;
  cudaEvent_t event_ = nullptr;
  std::string what_;
};

}  // namespace dtrain::nccl_backend
