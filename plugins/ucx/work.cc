#include "work.h"

namespace dtrain::ucx_backend {

P2pWork::P2pWork(std::shared_ptr<Fabric> fabric, Request r, Clock::time_point deadline)
    : fabric_(std::move(fabric)), req_(r), deadline_(deadline) {
  settle_locked();
}

P2pWork::~P2pWork() {
  std::lock_guard<std::mutex> lk(req_mu_);
  fabric_->discard(req_);
}

void P2pWork::settle_locked() {
  if (!fabric_->poll(req_)) return;
  try {
    fabric_->check(req_, req_.is_send ? "send" : "recv");
    complete(DT_OK);
  } catch (const sdk::Error& e) {
    complete(e.status(), e.what());
  }
}

bool P2pWork::poll() {
  std::unique_lock<std::mutex> lk(req_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  if (!req_.done()) settle_locked();
  return Work::test() != DT_IN_PROGRESS;
}

dt_status_t P2pWork::test() {
  if (Work::test() == DT_IN_PROGRESS) {
    fabric_->progress();
    poll();
  }
  return Work::test();
}

dt_status_t P2pWork::wait(int64_t timeout_ms) {
  if (Work::test() != DT_IN_PROGRESS) return Work::test();
  auto cap = timeout_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(timeout_ms);
  const char* what = req_.is_send ? "send" : "recv";
  try {
    fabric_->progress_until(
        [&] {
          if (Work::test() != DT_IN_PROGRESS) return true;
          poll();
          return Work::test() != DT_IN_PROGRESS;
        },
        std::min(deadline_, cap), what, [&] { return req_.peer; });
  } catch (const sdk::Error& e) {
    std::lock_guard<std::mutex> lk(req_mu_);
    fabric_->discard(req_);
    complete(e.status(), e.what());
  }
  return Work::test();
}

void P2pWork::cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lk(req_mu_);
  fabric_->discard(req_);
  complete(DT_ERR_ABORTED, reason);
}

}  // namespace dtrain::ucx_backend
