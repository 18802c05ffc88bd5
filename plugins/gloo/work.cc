#include "work.h"

#include <gloo/common/error.h>

namespace dtrain::gloo_backend {

void rethrow_gloo(const std::exception& e, const std::string& what) {
  std::string m = e.what();
  std::string msg = what + ": " + m;
  if (m.find("Timed out") != std::string::npos || m.find("timed out") != std::string::npos)
    sdk::fail(DT_ERR_TIMEOUT, msg);
  if (dynamic_cast<const ::gloo::IoException*>(&e)) sdk::fail(DT_ERR_REMOTE, msg);
  sdk::fail(DT_ERR_INTERNAL, msg);
}

void P2pWork::finish() {
  try {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now()) +
                std::chrono::milliseconds(200);
    if (left.count() < 1) left = std::chrono::milliseconds(1);
    int rank = -1;
    bool ok = is_send_ ? buf_->waitSend(&rank, left) : buf_->waitRecv(&rank, left);
    if (ok) complete(DT_OK);
    else complete(DT_ERR_ABORTED, std::string(is_send_ ? "send to" : "recv from") + " rank " +
                                      std::to_string(peer_) + " aborted");
  } catch (const std::exception& e) {
    try {
      rethrow_gloo(e, std::string(is_send_ ? "send to" : "recv from") + " rank " + std::to_string(peer_));
    } catch (const sdk::Error& err) {
      complete(err.status(), err.what());
    }
  }
}

void P2pWork::abort_wait() {
  if (is_send_) buf_->abortWaitSend();
  else buf_->abortWaitRecv();
}

P2pCompleter::P2pCompleter() : thread_([this] { loop(); }) {}

P2pCompleter::~P2pCompleter() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    if (current_) current_->abort_wait();
    cv_.notify_all();
  }
  thread_.join();
  for (auto& w : pending_) w->complete(DT_ERR_ABORTED, "communicator destroyed");
}

void P2pCompleter::add(std::shared_ptr<P2pWork> w) {
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_) {
    w->abort_wait();
    w->complete(DT_ERR_ABORTED, reason_);
    return;
  }
  pending_.push_back(std::move(w));
  cv_.notify_all();
}

void P2pCompleter::abort(const std::string& reason) {
  std::deque<std::shared_ptr<P2pWork>> q;
  {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = true;
    reason_ = reason;
    q.swap(pending_);
    if (current_) {
      current_->abort_wait();
      current_->complete(DT_ERR_ABORTED, reason);
    }
  }
  for (auto& w : q) {
    w->abort_wait();
    w->complete(DT_ERR_ABORTED, reason);
  }
}

void P2pCompleter::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      current_ = std::move(pending_.front());
      pending_.pop_front();
    }
    current_->finish();
    std::lock_guard<std::mutex> lk(mu_);
    current_.reset();
  }
}

}  // namespace dtrain::gloo_backend
