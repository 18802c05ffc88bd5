#include "comm/watchdog.h"

#include <condition_variable>
#include <thread>
#include <vector>

#include "common/log.h"

namespace dtrain::detail {

struct Watchdog::Impl {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool woken = false;
  std::vector<std::weak_ptr<CommState>> comms;
  std::vector<std::shared_ptr<WorkState>> orphans;
  std::thread thread;
};

Watchdog& Watchdog::instance() {
  static Watchdog* w = new Watchdog();  // never destroyed: works may outlive static destruction
  return *w;
}

Watchdog::Watchdog() : impl_(std::make_unique<Impl>()) {
  impl_->thread = std::thread([this] { run(); });
  impl_->thread.detach();
}

Watchdog::~Watchdog() = default;

void Watchdog::add(const std::shared_ptr<CommState>& comm) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->comms.push_back(comm);
}

void Watchdog::adopt_orphan(std::shared_ptr<WorkState> w) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->orphans.push_back(std::move(w));
}

void Watchdog::wake() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->woken = true;
  impl_->cv.notify_one();
}

void Watchdog::publish_heartbeats() {
  std::vector<std::shared_ptr<CommState>> comms;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    for (auto& weak : impl_->comms)
      if (auto c = weak.lock()) comms.push_back(std::move(c));
  }
  for (auto& c : comms) c->publish_heartbeat(false);
}

void Watchdog::run() {
  constexpr auto kTick = std::chrono::milliseconds(50);
  for (;;) {
    std::vector<std::shared_ptr<CommState>> comms;
    std::vector<std::shared_ptr<WorkState>> orphans;
    {
      std::unique_lock<std::mutex> lk(impl_->mu);
      impl_->cv.wait_for(lk, kTick, [&] { return impl_->woken; });
      impl_->woken = false;
      auto& v = impl_->comms;
      for (auto it = v.begin(); it != v.end();) {
        if (auto c = it->lock()) {
          comms.push_back(std::move(c));
          ++it;
        } else {
          it = v.erase(it);
        }
      }
      orphans.swap(impl_->orphans);
    }
    auto now = Clock::now();
    for (auto& c : comms) {
      // A poisoned communicator's process still says it is alive (see lost_peers).
      c->publish_heartbeat(false);
      if (c->poisoned.load()) continue;
      // Released outside the lock: the last reference may untrack its work.
      std::vector<std::shared_ptr<WorkState>> live;
      {
        std::lock_guard<SpinLock> lk(c->mu);
        live = c->inflight_works();
      }
      for (auto& w : live) {
        if (w->deadline() > now) continue;
        // A blocking op running inside its submitting call has no handle yet.
        dt_work_h h = w->handle.load(std::memory_order_acquire);
        if (!h) {
          c->expire(w);
          continue;
        }
        dt_status_t st = c->table->work_test(h);
        if (st == DT_IN_PROGRESS)
          c->expire(w);
        else
          c->settle(w, st);
      }
    }
    // Dropped works: keep them (and their plugin handles) until finished.
    std::vector<std::shared_ptr<WorkState>> keep;
    for (auto& w : orphans) {
      if (w->finished()) continue;
      dt_status_t st = w->comm->table->work_test(w->handle);
      if (st == DT_IN_PROGRESS && !w->comm->poisoned.load()) {
        if (w->deadline() <= now)
          w->comm->expire(w);
        else
          keep.push_back(std::move(w));
      } else if (st != DT_IN_PROGRESS) {
        w->comm->settle(w, st);
      }
    }
    if (!keep.empty()) {
      std::lock_guard<std::mutex> lk(impl_->mu);
      for (auto& w : keep) impl_->orphans.push_back(std::move(w));
    }
  }
}

}  // namespace dtrain::detail
