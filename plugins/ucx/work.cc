#include "work.h"

namespace dtrain::ucx_backend {

CollectiveWork::CollectiveWork(std::shared_ptr<OpQueue> queue, Body body, Clock::time_point deadline,
                               Clock::time_point now)
    : deadline(deadline), submitted(now), queue_(std::move(queue)), body_(std::move(body)) {}

dt_status_t CollectiveWork::test() {
  // status_ is final once done_ is set (release after complete()).
  return done_.load(std::memory_order_acquire) ? status_ : DT_IN_PROGRESS;
}

void CollectiveWork::finish(dt_status_t status, const std::string& message) {
  complete(status, message);
  done_.store(true, std::memory_order_release);
}

dt_status_t CollectiveWork::wait(int64_t timeout_ms) {
  if (!done_.load(std::memory_order_acquire)) {
    auto cap = timeout_ms < 0 ? Clock::time_point::max() : sdk::coarse_now() + std::chrono::milliseconds(timeout_ms);
    queue_->run_until(this, cap);
  }
  return test();
}

void CollectiveWork::run(Clock::time_point cap) {
  try {
    body_(std::min(deadline, cap));
    finish(DT_OK, "");
  } catch (const sdk::Error& e) {
    finish(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    finish(DT_ERR_SYSTEM, "ucx: out of memory");
  } catch (const std::exception& e) {
    finish(DT_ERR_INTERNAL, e.what());
  } catch (...) {
    finish(DT_ERR_INTERNAL, "ucx: unknown exception");
  }
  body_ = nullptr;
}

OpQueue::OpQueue(Timing timing, std::function<void()> idle_hook)
    : timing_(timing), idle_hook_(std::move(idle_hook)) {}

OpQueue::~OpQueue() { stop(); }

void OpQueue::start() {
  drainer_ = std::thread([this] { drain_loop(); });
}

void OpQueue::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_ && !drainer_.joinable()) return;
    stop_ = true;
    cv_.notify_all();
  }
  if (drainer_.joinable()) drainer_.join();
  std::deque<std::shared_ptr<CollectiveWork>> q;
  {
    std::lock_guard<std::mutex> lk(mu_);
    q.swap(queue_);
  }
  for (auto& w : q) w->finish(DT_ERR_ABORTED, "ucx: communicator destroyed");
}

std::shared_ptr<CollectiveWork> OpQueue::submit(CollectiveWork::Body body, Clock::time_point deadline,
                                                Clock::time_point now) {
  auto w = std::make_shared<CollectiveWork>(shared_from_this(), std::move(body), deadline, now);
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_ || stop_) {
    w->finish(DT_ERR_ABORTED, aborted_ ? reason_ : "ucx: communicator destroyed");
    return w;
  }
  queue_.push_back(w);
  last_submit_ = w->submitted;
  if (deep_sleep_) {
    deep_sleep_ = false;
    cv_.notify_all();
  }
  return w;
}

bool OpQueue::claim_head(std::unique_lock<std::mutex>&, std::shared_ptr<CollectiveWork>* out) {
  if (running_ || queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  running_ = *out;
  return true;
}

void OpQueue::release(const std::shared_ptr<CollectiveWork>& w) {
  std::lock_guard<std::mutex> lk(mu_);
  if (running_ == w) running_.reset();
  idle_cv_.notify_all();
}

void OpQueue::run_until(CollectiveWork* target, Clock::time_point cap) {
  while (target->test() == DT_IN_PROGRESS) {
    std::shared_ptr<CollectiveWork> w;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (!claim_head(lk, &w)) {
        // Someone else (the drainer) runs ops: wait for them in short slices.
        auto now = Clock::now();
        if (now >= cap) return;
        auto slice = std::min<Clock::time_point>(cap, now + std::chrono::milliseconds(1));
        idle_cv_.wait_until(lk, slice);
        continue;
      }
    }
    w->run(cap);
    release(w);
  }
}

void OpQueue::abort(const std::string& reason) {
  std::deque<std::shared_ptr<CollectiveWork>> q;
  std::shared_ptr<CollectiveWork> running;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!aborted_) {
      aborted_ = true;
      reason_ = reason;
    }
    q.swap(queue_);
    running = running_;
  }
  for (auto& w : q) w->finish(DT_ERR_ABORTED, reason);
  if (running) running->finish(DT_ERR_ABORTED, reason);
}

void OpQueue::quiesce() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return !running_; });
}

void OpQueue::drain_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    auto now = Clock::now();
    if (queue_.empty() && now - last_submit_ > timing_.idle) {
      deep_sleep_ = true;
      // Still wake now and then: posted point-to-point transfers may need progress.
      cv_.wait_for(lk, timing_.idle, [&] { return stop_ || !deep_sleep_; });
      deep_sleep_ = false;
      if (!running_ && !stop_) {
        lk.unlock();
        idle_hook_();
        lk.lock();
      }
      continue;
    }
    std::shared_ptr<CollectiveWork> w;
    if (!queue_.empty() && !aborted_ && now - queue_.front()->submitted >= timing_.grace && claim_head(lk, &w)) {
      lk.unlock();
      w->run(Clock::time_point::max());
      release(w);
      lk.lock();
      continue;
    }
    if (!running_) {
      lk.unlock();
      idle_hook_();
      lk.lock();
    }
    cv_.wait_for(lk, timing_.poll);
  }
}

}  // namespace dtrain::ucx_backend
