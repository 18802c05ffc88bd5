#include "work.h"

namespace dtrain::ps_grpc {

Op::Op(std::string what, int parts, sdk::Clock::time_point deadline, int64_t timeout_ms)
    : what_(std::move(what)), deadline_(deadline), timeout_ms_(timeout_ms), pending_(parts) {
  if (parts == 0) complete(DT_OK);
}

dt_status_t Op::wait(int64_t timeout_ms) {
  if (spin_.count() > 0 && timeout_ms != 0) {
    auto spin = spin_;  // at most 1 s (its bound, plugin.cc), so a longer timeout never shortens it
    if (timeout_ms > 0)
      spin = std::min<std::chrono::microseconds>(spin, std::chrono::milliseconds(std::min<int64_t>(timeout_ms, 1000)));
    const auto until = sdk::Clock::now() + spin;
    while (sdk::Clock::now() < until) {
      if (dt_status_t s = test(); s != DT_IN_PROGRESS) return s;
      std::this_thread::yield();
    }
  }
  return LongWork::wait(timeout_ms);
}

void Op::part_done(dt_status_t status, const std::string& message) {
  if (status != DT_OK) {
    std::lock_guard<std::mutex> lk(err_mu_);
    if (first_status_ == DT_OK) {
      first_status_ = status;
      first_error_ = message;
    }
  }
  if (pending_.fetch_sub(1) != 1) return;
  dt_status_t st;
  std::string msg;
  {
    std::lock_guard<std::mutex> lk(err_mu_);
    st = first_status_;
    msg = first_error_;
  }
  if (st == DT_OK && on_success && !done()) {
    try {
      on_success();
    } catch (const sdk::Error& e) {
      st = e.status();
      msg = e.what();
    } catch (const std::exception& e) {
      st = DT_ERR_INTERNAL;
      msg = e.what();
    }
  }
  complete(st, msg);
}

void Op::abort(const std::string& message) {
  std::unique_lock<std::shared_mutex> lk(out_mu_);
  complete(DT_ERR_ABORTED, message);
}

void TaskPool::join() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

void TaskPool::post(std::function<void()> task) {
  std::lock_guard<std::mutex> lk(mu_);
  tasks_.push_back(std::move(task));
  if (idle_ > static_cast<int>(tasks_.size()) - 1) {
    cv_.notify_one();
    return;
  }
  threads_.emplace_back([this] { loop(); });
}

void TaskPool::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
    --idle_;
    if (tasks_.empty()) return;  // stopping, nothing left
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lk.unlock();
    task();
    lk.lock();
  }
}

}  // namespace dtrain::ps_grpc
