#include "work.h"

namespace example {

void StoreRound::publish(const void* data, size_t bytes) const {
  store_.set(prefix_ + std::to_string(rank_), std::string(static_cast<const char*>(data), bytes));
}

std::string get_until(const dtrain::sdk::Store& store, const std::string& key, dtrain::sdk::Clock::time_point deadline,
                      const std::atomic<bool>& aborted) {
  for (;;) {
    if (aborted.load(std::memory_order_acquire)) dtrain::sdk::fail(DT_ERR_ABORTED, "example: aborted");
    try {
      return store.get(key, 20);
    } catch (const dtrain::sdk::Error& e) {
      if (e.status() != DT_ERR_TIMEOUT) throw;
      if (dtrain::sdk::Clock::now() >= deadline)
        dtrain::sdk::fail(DT_ERR_TIMEOUT, "example: timed out waiting for store key '" + key + "'");
    }
  }
}

std::string StoreRound::read(int from) const {
  return get_until(store_, prefix_ + std::to_string(from), deadline_, aborted_);
}

void StoreRound::finish() const {
  if (store_.add(prefix_ + "done", 1) < size_) return;
  for (int r = 0; r < size_; ++r) store_.remove(prefix_ + std::to_string(r));
  store_.remove(prefix_ + "done");
}

}  // namespace example
