#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

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

// Items 0..count-1 made by make(i) on `workers` threads, handed to the
// consumer in index order: parallel loading with the order (and so the
// batches) of one thread. A worker claims the next index only while fewer
// than `depth` items are ahead of the consumer. An exception from make(i) is
// rethrown by next() once items 0..i-1 have been handed out. The owner keeps
// what make uses alive until this is destroyed (declare it last); the
// destructor stops and joins the workers.
template <typename T>
class OrderedPrefetcher {
 public:
  OrderedPrefetcher(int64_t count, int workers, size_t depth, std::function<T(int64_t)> make)
      : make_(std::move(make)), end_(count), depth_(depth < 1 ? 1 : depth) {
    for (int w = 0; w < std::max(1, workers); ++w) threads_.emplace_back([this] { work(); });
  }
  ~OrderedPrefetcher() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  OrderedPrefetcher(const OrderedPrefetcher&) = delete;
  OrderedPrefetcher& operator=(const OrderedPrefetcher&) = delete;

  // The next item in index order; false at the end. Rethrows make's error.
  bool next(T* out) {
    auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return ready_.count(next_out_) || next_out_ >= error_at_ || next_out_ >= end_; });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto it = ready_.find(next_out_);
    if (it != ready_.end()) {
      *out = std::move(it->second);
      ready_.erase(it);
      ++next_out_;
      lk.unlock();
      cv_.notify_all();
      return true;
    }
    if (next_out_ >= error_at_) std::rethrow_exception(error_);
    return false;
  }
  double wait_seconds() const { return wait_seconds_; }

 private:
  void work() {
    while (true) {
      int64_t i = 0;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] {
          return stop_ || next_claim_ >= std::min(end_, error_at_) || next_claim_ < next_out_ + int64_t(depth_);
        });
        if (stop_ || next_claim_ >= std::min(end_, error_at_)) return;
        i = next_claim_++;
      }
      try {
        T item = make_(i);
        std::lock_guard<std::mutex> lk(mu_);
        ready_.emplace(i, std::move(item));
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (i < error_at_) error_at_ = i, error_ = std::current_exception();
      }
      cv_.notify_all();
    }
  }

  std::function<T(int64_t)> make_;
  const int64_t end_;
  const size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, T> ready_;
  int64_t next_claim_ = 0, next_out_ = 0, error_at_ = std::numeric_limits<int64_t>::max();
  std::exception_ptr error_;
  bool stop_ = false;
  double wait_seconds_ = 0;
  std::vector<std::thread> threads_;  // last: they use the members above
};

}  // namespace dtrain::apps
