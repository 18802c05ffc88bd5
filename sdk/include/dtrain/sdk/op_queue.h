#pragma once
// The execution layer every dtrain plugin runs its collectives on: one
// in-order queue per communicator whose ops run inline on the thread that
// waits for them (no hand-off on the latency path), with a lazy background
// drainer for ops nobody waits for. Header-only, standard C++17.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dtrain/sdk/clock.h"
#include "dtrain/sdk/error.h"
#include "dtrain/sdk/work.h"

namespace dtrain::sdk {

class OpQueue;

// Drainers left blocked in a transport call when their queue shut down
// (OpQueue::shutdown). Each ends on its own, at its op's deadline, running
// the plugin's code until then, so the plugin must stay mapped: the core
// loads plugins with RTLD_NODELETE (plugin_registry.cc). adopt() detaches
// the thread at once (it may be the caller itself, and a finished thread
// nobody joins is what ThreadSanitizer reports as a leak) and keeps its
// `done` flag. One registry per plugin (this header is compiled into each,
// with hidden visibility). close() runs when the process exits (or the
// plugin is unloaded by a host that does unload): it waits up to its wait
// (kExitWait) for every adopted drainer's flag, those adopted while it runs
// included, so the process does not exit under a drainer about to finish.
// Communicators may still shut down after it (the core's watchdog can hold
// the last reference to one while the process exits); their drainers are
// not waited for.
class DetachedDrainers {
 public:
  static constexpr std::chrono::milliseconds kExitWait{10000};

  // The plugin's registry (OpQueue::shutdown adopts into it). It lives in
  // static storage and is never destroyed, so adopt() stays valid during and
  // after static destruction; a static guard closes it then (a closed
  // registry holds no heap memory).
  static DetachedDrainers& get() {
    alignas(DetachedDrainers) static unsigned char storage[sizeof(DetachedDrainers)];
    static auto* registry = new (storage) DetachedDrainers();
    static struct Closer {
      ~Closer() { registry->close(); }
    } closer;
    return *registry;
  }
  explicit DetachedDrainers(std::chrono::milliseconds wait = kExitWait) : wait_(wait) {}
  DetachedDrainers(const DetachedDrainers&) = delete;
  DetachedDrainers& operator=(const DetachedDrainers&) = delete;
  // `done` is set by the drainer as the last thing its own code does. The
  // flags of drainers done by now are dropped here, so a process that aborts
  // many communicators keeps none of theirs.
  void adopt(std::thread t, std::shared_ptr<std::atomic<bool>> done) {
    t.detach();
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    drop_done();
    pending_.push_back(std::move(done));
  }
  // Drainers adopted and not seen done yet.
  size_t size() {
    std::lock_guard<std::mutex> lk(mu_);
    drop_done();
    return pending_.size();
  }
  // Waits as said above; later adopters are not waited for.
  void close() {
    const auto until = std::chrono::steady_clock::now() + wait_;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      drop_done();
      if (pending_.empty() || std::chrono::steady_clock::now() >= until) break;
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      lk.lock();
    }
    closed_ = true;
    std::vector<std::shared_ptr<std::atomic<bool>>>().swap(pending_);
  }
  ~DetachedDrainers() { close(); }

 private:
  void drop_done() {
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const auto& d) { return d->load(std::memory_order_acquire); }),
                   pending_.end());
  }
  const std::chrono::milliseconds wait_;
  std::mutex mu_;
  std::vector<std::shared_ptr<std::atomic<bool>>> pending_;
  bool closed_ = false;
};

// A collective queued on an OpQueue. Its body runs once, on the thread that
// waits for it or on the queue's drainer. test() reads a lock-free flag (the
// latency path polls it); on a lazy queue an unfinished test() also wakes
// the drainer. The body lives in the work itself (QueuedBody<F>): one
// allocation per op.
class QueuedWork : public Work {
 public:
  using Body = std::function<void(Clock::time_point deadline)>;
  QueuedWork(std::shared_ptr<OpQueue> queue, Clock::time_point deadline, bool inline_ok)
      : deadline(deadline), inline_ok(inline_ok), queue_(std::move(queue)) {}

  inline dt_status_t test() override;
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Runs this op, and the ones queued before it, on the calling thread (see
  // OpQueue for when); else waits for the thread that runs them.
  inline dt_status_t wait(int64_t timeout_ms) override;

  // Runs the body once with a deadline capped at cap, then completes.
  void run(Clock::time_point cap) {
    std::string msg;
    dt_status_t st = detail::guarded(&msg, [&]() -> dt_status_t {
      invoke(std::min(deadline, cap));
      return DT_OK;
    });
    finish(st, msg);
    drop_body();
  }
  // complete() plus the lock-free done flag; every completion goes here.
  void finish(dt_status_t status, const std::string& message) {
    complete(status, message);
    done_.store(true, std::memory_order_release);
  }

  const Clock::time_point deadline;
  const bool inline_ok;  // see OpQueue::submit

 protected:
  virtual void invoke(Clock::time_point deadline) = 0;
  virtual void drop_body() = 0;  // releases what the body holds

 private:
  friend class OpQueue;
  std::shared_ptr<OpQueue> queue_;
  std::atomic<bool> done_{false};
  uint64_t ticket_ = 0;  // submission number (under the queue's mutex)
};

template <typename F>
class QueuedBody final : public QueuedWork {
 public:
  template <typename G>
  QueuedBody(std::shared_ptr<OpQueue> queue, G&& body, Clock::time_point deadline, bool inline_ok)
      : QueuedWork(std::move(queue), deadline, inline_ok), body_(std::in_place, std::forward<G>(body)) {}

 private:
  void invoke(Clock::time_point deadline) override { (*body_)(deadline); }
  void drop_body() override { body_.reset(); }
  std::optional<F> body_;
};

// The in-order queue of one communicator's collectives. Exactly one thread
// runs ops at a time. The waiter of an op runs everything queued up to it on
// its own thread. A drainer thread wakes every poll interval while the
// communicator is busy and runs ops nobody claimed within the grace period,
// so dropped works complete and submitted ops progress during the caller's
// compute; it is never woken per op, so the latency path has no hand-off.
//
// Settings::interruptible says what the transport's blocking calls do:
//  - true (UCX): they return promptly on abort and honour any deadline they
//    are given. A waiter runs ops inline for at most its own wait bound; an op
//    cut short by that bound fails with DT_ERR_TIMEOUT.
//  - false (Gloo): only the op's own deadline ends them, and an abort cannot
//    reach a thread blocked inside. A waiter runs ops inline only when it is
//    prepared to wait until the op's deadline anyway (the core's waits are);
//    a shorter wait leaves the op to the drainer, and so does an op submitted
//    with inline_ok = false (its transport waits may outlast its deadline, as
//    Gloo's connection-level waits outlast a per-call timeout shorter than
//    the communicator's). If an op is still blocked
//    in the transport at shutdown after an abort, the drainer is left to
//    finish on its own (a body must hold, by shared_ptr, what it touches),
//    detached by DetachedDrainers, which the process's exit waits for.
class OpQueue : public std::enable_shared_from_this<OpQueue> {
 public:
  struct Settings {
    bool interruptible = false;
    // The drainer sleeps until it is needed instead of polling every `poll`
    // while the communicator is busy: it wakes when an op queues behind
    // another, when a queued op is tested, when a waiter leaves its op to it,
    // and for ops submitted with inline_ok = false. No periodic wake-up lands
    // on the latency path; an op nobody waits for or tests stays queued until
    // one of those happens (the core's watchdog tests dropped works).
    bool lazy = false;
    std::chrono::microseconds grace{1000};
    std::chrono::microseconds poll{2000};
    std::chrono::milliseconds idle{500};
    // Runs on the drainer while no op runs (a plugin progresses posted
    // point-to-point transfers there). Never runs after shutdown() returns.
    std::function<void()> idle_hook;
  };

  // The drainer holds the queue: its owner must call shutdown().
  static std::shared_ptr<OpQueue> create(Settings settings) {
    std::shared_ptr<OpQueue> q(new OpQueue(std::move(settings)));
    auto done = std::make_shared<std::atomic<bool>>(false);
    q->drainer_done_ = done;
    q->drainer_ = std::thread([q, done]() mutable {
      q->drain_loop();
      q.reset();
      done->store(true, std::memory_order_release);
    });
    return q;
  }
  ~OpQueue() { shutdown("communicator destroyed"); }
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  const Settings& settings() const { return settings_; }

  // Queues body (any callable taking the op's deadline) with its deadline
  // (see clock.h: deadline_after()). inline_ok = false (non-interruptible
  // queues only): the op never runs on a waiting thread; the drainer takes it
  // at once. The latency path reads no precise clock here: the drainer
  // measures an op's grace period from when it first sees it queued.
  template <typename F>
  std::shared_ptr<QueuedWork> submit(F&& body, Clock::time_point deadline, bool inline_ok = true) {
    inline_ok = inline_ok || settings_.interruptible;
    std::shared_ptr<QueuedWork> w =
        std::make_shared<QueuedBody<std::decay_t<F>>>(shared_from_this(), std::forward<F>(body), deadline, inline_ok);
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_ || stop_) {
      w->finish(DT_ERR_ABORTED, aborted_ ? reason_ : "communicator destroyed");
      return w;
    }
    w->ticket_ = ++submits_;
    queue_.push_back(w);
    bool behind = settings_.lazy && queue_.size() > 1;
    if (deep_sleep_ || !inline_ok || behind) {
      deep_sleep_ = false;
      kicked_ = kicked_ || !inline_ok || behind;
      cv_.notify_all();
    }
    return w;
  }

  // An op whose caller blocks until it finishes (DT_CALL_WAIT): on an
  // interruptible queue with nothing queued or running, runs body(deadline)
  // on this thread now, with no queued work, and returns null when it
  // succeeded or a finished work holding its error. Otherwise (a busy or
  // non-interruptible queue) it is submit(body, deadline). The drainer and
  // the idle hook stay off while the body runs, as for any running op.
  template <typename F>
  std::shared_ptr<Work> run_or_submit(F&& body, Clock::time_point deadline) {
    if (settings_.interruptible) {
      std::unique_lock<std::mutex> lk(mu_);
      if (!aborted_ && !stop_ && !running_ && !inline_running_ && queue_.empty()) {
        inline_running_ = true;
        ++submits_;
        lk.unlock();
        struct Release {
          OpQueue* q;
          ~Release() { q->release_inline(); }
        } release{this};
        std::string msg;
        dt_status_t st = detail::guarded(&msg, [&]() -> dt_status_t {
          body(deadline);
          return DT_OK;
        });
        if (st == DT_OK) return nullptr;
        auto w = std::make_shared<Work>();
        w->complete(st, msg);
        return w;
      }
    }
    return submit(std::forward<F>(body), deadline);
  }

  // Runs queued ops in order on this thread until target completes or cap
  // passes; bodies get min(deadline, cap) as their deadline when
  // cap_bodies, else their own deadline.
  void run_until(QueuedWork* target, Clock::time_point cap, bool cap_bodies) {
    while (!target->done()) {
      std::shared_ptr<QueuedWork> w;
      {
        std::unique_lock<std::mutex> lk(mu_);
        bool head_inline = queue_.empty() || queue_.front()->inline_ok;
        if (!head_inline) {
          kicked_ = true;
          cv_.notify_all();
        }
        if (!head_inline || !claim_head(&w)) {
          // Another thread (the drainer) runs ops: wait for it in short slices.
          auto now = Clock::now();
          if (now >= cap) return;
          idle_cv_.wait_until(lk, std::min<Clock::time_point>(cap, now + std::chrono::milliseconds(1)));
          continue;
        }
      }
      w->run(cap_bodies ? cap : Clock::time_point::max());
      release(w);
    }
  }

  // Fails every queued op and the running one with DT_ERR_ABORTED (a body
  // still running returns on its own; its result is ignored).
  void abort(const std::string& reason) {
    std::deque<std::shared_ptr<QueuedWork>> q;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!aborted_) {
        aborted_ = true;
        reason_ = reason;
      }
      q.swap(queue_);
      // Under the lock: its runner holds it until release(), which takes the lock.
      if (running_) running_->finish(DT_ERR_ABORTED, reason);
    }
    for (auto& w : q) w->finish(DT_ERR_ABORTED, reason);
  }

  // Stops the drainer and fails what is still queued. Interruptible queues
  // then wait until no body runs anywhere, run_or_submit's inline ones too
  // (the caller has aborted the transport first); others hand a drainer
  // still blocked in a body to DetachedDrainers.
  void shutdown(const std::string& reason) {
    bool detach = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
      stop_ = true;
      detach = !settings_.interruptible && aborted_ && running_ && running_on_drainer_;
      cv_.notify_all();
    }
    if (drainer_.joinable()) {
      if (detach || drainer_.get_id() == std::this_thread::get_id())
        DetachedDrainers::get().adopt(std::move(drainer_), drainer_done_);
      else
        drainer_.join();
    }
    std::deque<std::shared_ptr<QueuedWork>> q;
    {
      std::lock_guard<std::mutex> lk(mu_);
      q.swap(queue_);
    }
    for (auto& w : q) w->finish(DT_ERR_ABORTED, reason);
    if (settings_.interruptible) {
      std::unique_lock<std::mutex> lk(mu_);
      idle_cv_.wait(lk, [&] { return !running_ && !inline_running_; });
    }
  }

  // Wakes the drainer now (a waiter that will not run its op inline).
  void kick() {
    std::lock_guard<std::mutex> lk(mu_);
    deep_sleep_ = false;
    kicked_ = true;
    cv_.notify_all();
  }

 private:
  explicit OpQueue(Settings settings) : settings_(std::move(settings)) {}

  bool claim_head(std::shared_ptr<QueuedWork>* out) {
    if (running_ || inline_running_ || queue_.empty()) return false;
    *out = std::move(queue_.front());
    queue_.pop_front();
    running_ = out->get();
    return true;
  }
  void release(const std::shared_ptr<QueuedWork>& w) {
    std::lock_guard<std::mutex> lk(mu_);
    if (running_ == w.get()) running_ = nullptr;
    running_on_drainer_ = false;
    idle_cv_.notify_all();
    if (kicked_) cv_.notify_all();
  }
  void release_inline() {
    std::lock_guard<std::mutex> lk(mu_);
    inline_running_ = false;
    idle_cv_.notify_all();
    if (kicked_) cv_.notify_all();
  }
  void idle(std::unique_lock<std::mutex>& lk) {
    if (running_ || inline_running_ || stop_ || !settings_.idle_hook) return;
    lk.unlock();
    settings_.idle_hook();
    lk.lock();
  }
  void drain_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_ && settings_.lazy) {
      cv_.wait(lk, [&] { return stop_ || (kicked_ && !queue_.empty() && !aborted_); });
      std::shared_ptr<QueuedWork> w;
      if (stop_ || !claim_head(&w)) {
        if (queue_.empty()) kicked_ = false;
        if (!stop_) cv_.wait_for(lk, std::chrono::milliseconds(1));  // another thread runs the head
        continue;
      }
      running_on_drainer_ = true;
      lk.unlock();
      w->run(Clock::time_point::max());
      release(w);
      lk.lock();
      if (queue_.empty()) kicked_ = false;
    }
    // Polling drainer. Grace and idleness are measured on this thread from
    // what it sees (the head's ticket, the submission count), so submitters
    // read no precise clock.
    uint64_t seen_head = 0, seen_submits = 0;
    Clock::time_point head_since{}, active_at = Clock::now();
    while (!stop_) {
      auto now = Clock::now();
      if (submits_ != seen_submits) {
        seen_submits = submits_;
        active_at = now;
      }
      if (queue_.empty() && now - active_at > settings_.idle) {
        deep_sleep_ = true;
        // Still wake now and then: posted point-to-point transfers may need progress.
        cv_.wait_for(lk, settings_.idle, [&] { return stop_ || !deep_sleep_; });
        deep_sleep_ = false;
        active_at = Clock::now();
        idle(lk);
        continue;
      }
      if (queue_.empty()) kicked_ = false;
      if (!queue_.empty() && queue_.front()->ticket_ != seen_head) {
        seen_head = queue_.front()->ticket_;
        head_since = now;
      }
      std::shared_ptr<QueuedWork> w;
      if (!queue_.empty() && !aborted_ && (kicked_ || now - head_since >= settings_.grace) && claim_head(&w)) {
        kicked_ = false;
        running_on_drainer_ = true;
        lk.unlock();
        w->run(Clock::time_point::max());
        release(w);
        lk.lock();
        continue;
      }
      idle(lk);
      if (stop_) break;
      if (kicked_ && !running_ && !inline_running_) continue;
      // A head seen for the first time is due after the grace period, not a whole poll later.
      auto wake = now + settings_.poll;
      if (!queue_.empty() && !running_) wake = std::min(wake, head_since + settings_.grace);
      cv_.wait_until(lk, wake);
    }
  }

  Settings settings_;
  std::mutex mu_;
  std::condition_variable cv_;       // the drainer sleeps here
  std::condition_variable idle_cv_;  // running_ became null
  std::deque<std::shared_ptr<QueuedWork>> queue_;
  QueuedWork* running_ = nullptr;  // held by the thread running it
  bool inline_running_ = false;    // run_or_submit runs a body with no queued work
  bool running_on_drainer_ = false;
  bool stop_ = false;
  bool aborted_ = false;
  bool deep_sleep_ = false;
  bool kicked_ = false;
  uint64_t submits_ = 0;
  std::string reason_;
  std::thread drainer_;
  std::shared_ptr<std::atomic<bool>> drainer_done_;
};

inline dt_status_t QueuedWork::test() {
  // status_ is final once done_ is set (released after complete()).
  if (done_.load(std::memory_order_acquire)) return status_;
  if (queue_->settings().lazy) queue_->kick();
  return DT_IN_PROGRESS;
}

inline dt_status_t QueuedWork::wait(int64_t timeout_ms) {
  if (done()) return status_;
  auto cap = timeout_ms < 0 ? Clock::time_point::max() : coarse_now() + std::chrono::milliseconds(timeout_ms);
  if (queue_->settings().interruptible) {
    queue_->run_until(this, cap, true);
    return test();
  }
  // The core waits until the deadline (it passes the time left to it); a
  // tick of slack covers the coarse clock.
  if (inline_ok && cap + std::chrono::milliseconds(100) >= deadline) {
    queue_->run_until(this, Clock::time_point::max(), false);
    return test();
  }
  queue_->kick();
  Work::wait(timeout_ms);
  return test();
}

}  // namespace dtrain::sdk
