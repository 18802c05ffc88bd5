#pragma once
// SYNC mode's step barrier of one table (backend_v1.h, DT_PS_MODE_SYNC): the
// n-th push of each worker is its step n; per-worker queues hold the pushed
// steps until every worker has pushed the oldest one, which is then applied
// (in worker order, under this object's lock, so steps are applied one at a
// time and in order). A worker's pull waits until every step it pushed is
// applied.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/sdk/error.h"
#include "engine/table.h"

namespace dtrain::ps_grpc {

template <class Step>
class SyncSteps {
 public:
  explicit SyncSteps(int workers) : pushed_(workers, 0), queues_(workers) {}

  // Queues worker's next step and applies every step now complete:
  // apply(const std::vector<const Step*>& by_worker) runs under the lock.
  template <class Apply>
  void push(int worker, Step&& step, Apply&& apply) {
    std::lock_guard<std::mutex> lk(mu_);
    queues_[worker].push_back(std::move(step));
    ++pushed_[worker];
    bool any = false;
    for (;;) {
      for (const auto& q : queues_)
        if (q.empty()) goto done;
      {
        std::vector<const Step*> fronts;
        fronts.reserve(queues_.size());
        for (const auto& q : queues_) fronts.push_back(&q.front());
        apply(fronts);
      }
      for (auto& q : queues_) q.pop_front();
      ++applied_;
      any = true;
    }
  done:
    if (any) cv_.notify_all();
  }

  // Waits until every step worker pushed is applied; DT_ERR_TIMEOUT naming
  // the workers that have not pushed the awaited step once deadline passes.
  void wait(int worker, Clock::time_point deadline, const std::string& table) {
    std::unique_lock<std::mutex> lk(mu_);
    if (cv_.wait_until(lk, deadline, [&] { return applied_ >= pushed_[worker]; })) return;
    const uint64_t step = applied_ + 1;
    std::string missing;
    for (size_t w = 0; w < pushed_.size(); ++w)
      if (pushed_[w] < step) missing += (missing.empty() ? "" : ", ") + std::to_string(w);
    sdk::fail(DT_ERR_TIMEOUT, "table '" + table + "' sync step " + std::to_string(step) + ": waiting for worker(s) " +
                                  missing + " that have not pushed it (worker " + std::to_string(worker) +
                                  " has pushed " + std::to_string(pushed_[worker]) + " steps)");
  }

  uint64_t applied() const {
    std::lock_guard<std::mutex> lk(mu_);
    return applied_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> pushed_;
  uint64_t applied_ = 0;
  std::vector<std::deque<Step>> queues_;
};

}  // namespace dtrain::ps_grpc
