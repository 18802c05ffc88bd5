#pragma once
// The plugin-side unit of work. Header-only, standard C++17.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "dtrain/abi/backend_v1.h"

namespace dtrain::sdk {

namespace detail {
struct WorkHandle;
}  // namespace detail

// A unit of work. Thread-safe. complete() is called once by whoever finishes
// the op; later calls are ignored.
class Work {
 public:
  virtual ~Work() = default;
  virtual dt_status_t test() {
    std::lock_guard<std::mutex> lk(mu_);
    return status_;
  }
  virtual dt_status_t wait(int64_t timeout_ms) {
    std::unique_lock<std::mutex> lk(mu_);
    auto ready = [&] { return status_ != DT_IN_PROGRESS; };
    if (timeout_ms < 0)
      cv_.wait(lk, ready);
    else
      cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), ready);
    return status_;
  }
  std::string error() const {
    std::lock_guard<std::mutex> lk(mu_);
    return error_;
  }
  void complete(dt_status_t status = DT_OK, const std::string& message = "") {
    std::lock_guard<std::mutex> lk(mu_);
    if (status_ != DT_IN_PROGRESS) return;
    status_ = status;
    if (!message.empty()) error_ = message;
    cv_.notify_all();
  }

 protected:
  mutable std::mutex mu_;
  // The ABI handle (backend.h): a work handed out once is its own handle,
  // kept alive by abi_self_ until work_release; abi_error_ is what
  // work_error returns.
  friend struct detail::WorkHandle;
  std::atomic<bool> abi_claimed_{false};
  std::shared_ptr<Work> abi_self_;
  std::string abi_error_;

  std::condition_variable cv_;
  dt_status_t status_ = DT_IN_PROGRESS;
  std::string error_;
};

}  // namespace dtrain::sdk
