#pragma once
// Point-to-point completion: posted transfers, tracked per communicator so an
// abort fails them all. Header-only, standard C++17.

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/sdk/work.h"

namespace dtrain::sdk {

// A send or recv posted to the transport at submission (so any order of sends
// and receives between ranks works). A plugin subclasses it with its
// transport's request and completes it when the transport says so.
class PostedWork : public Work {
 public:
  // Nonblocking: completes the work if the transport has finished the
  // transfer; true once the work is complete. For P2pTracker::Mode::Poll.
  virtual bool poll() { return Work::test() != DT_IN_PROGRESS; }
  // Blocks in the transport until the transfer ends and completes the work,
  // or returns early after cancel(). For P2pTracker::Mode::Thread.
  virtual void finish() {}
  // Stops the transfer (cancels the request, wakes a blocked finish()) and
  // fails the work with DT_ERR_ABORTED and reason. Any thread, idempotent.
  virtual void cancel(const std::string& reason) = 0;
};

// The outstanding point-to-point works of one communicator. It holds each
// until it completes (the transport may write into its buffer until then),
// and abort() cancels them all. Two ways to complete them:
//  - Mode::Poll: the plugin calls progress() (from its op queue's idle hook),
//    which polls each work; waiters may also complete their own.
//  - Mode::Thread: a thread of the tracker's own calls finish() on each work,
//    oldest first, for transports with no nonblocking check. Waiting in order
//    cannot deadlock: every transfer is already posted.
class P2pTracker {
 public:
  enum class Mode { Poll, Thread };

  explicit P2pTracker(Mode mode) : mode_(mode) {
    if (mode_ == Mode::Thread) thread_ = std::thread([this] { loop(); });
  }
  ~P2pTracker() {
    abort("communicator destroyed");
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }
  P2pTracker(const P2pTracker&) = delete;
  P2pTracker& operator=(const P2pTracker&) = delete;

  // Tracks w (already posted); after abort() it is cancelled at once.
  void add(std::shared_ptr<PostedWork> w) {
    std::unique_lock<std::mutex> lk(mu_);
    if (aborted_) {
      std::string reason = reason_;
      lk.unlock();
      w->cancel(reason);
      return;
    }
    pending_.push_back(std::move(w));
    if (mode_ == Mode::Thread) cv_.notify_all();
  }

  bool empty() {
    std::lock_guard<std::mutex> lk(mu_);
    return pending_.empty();
  }

  // Mode::Poll: polls every outstanding work and drops completed ones.
  // Returns false when none is left.
  bool progress() {
    std::vector<std::shared_ptr<PostedWork>> live;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (pending_.empty()) return false;
      live.assign(pending_.begin(), pending_.end());
    }
    bool left = false;
    for (auto& w : live) left = !w->poll() || left;
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = pending_.begin(); it != pending_.end();)
      it = (*it)->Work::test() != DT_IN_PROGRESS ? pending_.erase(it) : it + 1;
    return left;
  }

  // Cancels every outstanding work (and the one being finished) with reason;
  // later add()s are cancelled at once.
  void abort(const std::string& reason) {
    std::deque<std::shared_ptr<PostedWork>> q;
    std::shared_ptr<PostedWork> current;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!aborted_) {
        aborted_ = true;
        reason_ = reason;
      }
      q.swap(pending_);
      current = current_;
    }
    if (current) current->cancel(reason);
    for (auto& w : q) w->cancel(reason);
  }

 private:
  void loop() {
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

  const Mode mode_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<PostedWork>> pending_;
  std::shared_ptr<PostedWork> current_;
  bool stop_ = false;
  bool aborted_ = false;
  std::string reason_;
  std::thread thread_;
};

}  // namespace dtrain::sdk
