#include "work.h"

#include <chrono>
#include <thread>

namespace dtrain::nccl_backend {

void check_cuda(cudaError_t st, const std::string& what) {
  if (st == cudaSuccess) return;
  cudaGetLastError();
  sdk::fail(DT_ERR_SYSTEM, "nccl: " + what + " failed: " + cudaGetErrorName(st) + ": " + cudaGetErrorString(st));
}

dt_status_t status_of(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return DT_OK;
    case ncclInProgress: return DT_IN_PROGRESS;
    case ncclInvalidArgument:
    case ncclInvalidUsage: return DT_ERR_INVALID_USAGE;
    case ncclRemoteError: return DT_ERR_REMOTE;
    case ncclSystemError:
    case ncclUnhandledCudaError: return DT_ERR_SYSTEM;
    default: return DT_ERR_INTERNAL;
  }
}

NcclState::~NcclState() {
  if (aborted_.load()) return;
  // Every work of this communicator is done or released: finalize flushes
  // what NCCL still holds, bounded, then frees; an error or a stuck finalize
  // falls back to abort.
  if (comm_ == nullptr) return;
  cudaSetDevice(device_);
  ncclResult_t r = ncclCommFinalize(comm_);
  auto until = sdk::Clock::now() + std::chrono::seconds(10);
  while (r == ncclInProgress && sdk::Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
  }
  if (r == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    sdk::Log::warn(std::string("nccl: finalizing the communicator failed (") + ncclGetErrorString(r) +
                   "); aborting it");
    ncclCommAbort(comm_);
  }
}

std::string NcclState::abort_reason() const {
  std::lock_guard<std::mutex> lk(info_mu_);
  return abort_reason_;
}

std::string NcclState::failure() const {
  std::lock_guard<std::mutex> lk(info_mu_);
  return failure_;
}

ncclResult_t NcclState::poll_async_error(std::string* message) {
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock() || aborted_.load(std::memory_order_acquire)) return ncclInProgress;
  {
    std::lock_guard<std::mutex> info(info_mu_);
    if (!failure_.empty()) {
      if (message) *message = failure_;
      return ncclRemoteError;
    }
  }
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
  if (r != ncclSuccess) async = r;
  if (async == ncclSuccess || async == ncclInProgress) return async;
  std::string m = std::string("rank ") + std::to_string(rank_) + ": NCCL reported " + ncclGetErrorString(async) + ": " +
                  ncclGetLastError(comm_);
  std::lock_guard<std::mutex> info(info_mu_);
  failure_ = m;
  if (message) *message = m;
  return async;
}

void NcclState::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> info(info_mu_);
    if (aborted_.load(std::memory_order_acquire)) return;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (comm_ == nullptr) return;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  ncclResult_t r = ncclCommAbort(comm_);
  if (r != ncclSuccess && r != ncclInProgress)
    sdk::Log::warn(std::string("nccl: ncclCommAbort: ") + ncclGetErrorString(r));
  comm_ = nullptr;
  if (prev >= 0) cudaSetDevice(prev);
  cudaGetLastError();
}

EventWork::EventWork(std::shared_ptr<NcclState> state, cudaStream_t stream, std::string what)
    : state_(std::move(state)), what_(std::move(what)) {
  check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate for " + what_);
  cudaError_t st = cudaEventRecord(event_, stream);
  if (st != cudaSuccess) {
    cudaEventDestroy(event_);
    event_ = nullptr;
    check_cuda(st, "cudaEventRecord after " + what_);
  }
}

EventWork::~EventWork() {
  // Destroying an event that has not fired is allowed: CUDA frees it when it does.
  if (event_) cudaEventDestroy(event_);
  cudaGetLastError();
}

dt_status_t EventWork::test() {
  dt_status_t s = sdk::Work::test();
  if (s != DT_IN_PROGRESS) return s;
  if (state_->aborted()) {
    complete(DT_ERR_ABORTED, what_ + " aborted: " + state_->abort_reason());
    return sdk::Work::test();
  }
  cudaError_t q = cudaEventQuery(event_);
  if (q == cudaSuccess) {
    complete(DT_OK);
    return DT_OK;
  }
  if (q != cudaErrorNotReady) {
    cudaGetLastError();
    complete(DT_ERR_SYSTEM,
             "nccl: " + what_ + ": cudaEventQuery: " + cudaGetErrorName(q) + ": " + cudaGetErrorString(q));
    return sdk::Work::test();
  }
  std::string msg;
  ncclResult_t r = state_->poll_async_error(&msg);
  if (r != ncclSuccess && r != ncclInProgress) complete(status_of(r), "nccl: " + what_ + " failed: " + msg);
  return sdk::Work::test();
}

dt_status_t PolledWork::wait(int64_t timeout_ms) {
  auto start = sdk::Clock::now();
  auto until = start + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  for (;;) {
    dt_status_t s = test();
    if (s != DT_IN_PROGRESS) return s;
    auto now = sdk::Clock::now();
    if (timeout_ms >= 0 && now >= until) return DT_IN_PROGRESS;
    auto pause = poll_pause(now - start);
    if (pause.count() > 0)
      std::this_thread::sleep_for(pause);
    else
      std::this_thread::yield();
  }
}

}  // namespace dtrain::nccl_backend
