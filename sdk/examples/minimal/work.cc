#include "work.h"

namespace example {

void StoreRound::publish(const void* data, size_t bytes) const {
  store_.set(prefix_ + std::to_string(rank_), std::string(static_cast<const char*>(data), bytes));
}

std::string StoreRound::read(int from) const { return store_.get(prefix_ + std::to_string(from), timeout_ms_); }

void StoreRound::finish() const {
  if (store_.add(prefix_ + "done", 1) < size_) return;
  for (int r = 0; r < size_; ++r) store_.remove(prefix_ + std::to_string(r));
  store_.remove(prefix_ + "done");
}

}  // namespace example
