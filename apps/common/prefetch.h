#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace dtrain::apps {

// The background half of every app's data loader: a producer thread fills a
// queue up to `depth` items ahead of the consumer.
//
// produce(push) runs on the thread; push(item) blocks while `depth` items
// wait and returns false once the consumer is gone (produce should then
// return). An exception from produce is rethrown by next() after the items
// produced before it. The owner keeps what produce uses alive until the
// Prefetcher is destroyed (declare it last); the destructor stops and joins.
template <typename T>
class Prefetcher {
 public:
  using Push = std::function<bool(T)>;
  Prefetcher(size_t depth, std::function<void(const Push&)> produce) : depth_(depth < 1 ? 1 : depth) {
    thread_ = std::thread([this, produce = std::move(produce)] { run(produce); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next item; false at the end. Rethrows the producer's error.
  bool next(T* out) {
    auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !queue_.empty() || done_; });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!queue_.empty()) {
      *out = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      cv_.notify_all();
      return true;
    }
    if (error_) std::rethrow_exception(error_);
    return false;
  }
  // Seconds the consumer spent waiting in next().
  double wait_seconds() const { return wait_seconds_; }

 private:
  void run(const std::function<void(const Push&)>& produce) {
    try {
      produce([this](T item) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || queue_.size() < depth_; });
        if (stop_) return false;
        queue_.push_back(std::move(item));
        lk.unlock();
        cv_.notify_all();
        return true;
      });
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }

  size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> queue_;
  std::exception_ptr error_;
  bool done_ = false, stop_ = false;
  double wait_seconds_ = 0;
  std::thread thread_;
};

}  // namespace dtrain::apps
