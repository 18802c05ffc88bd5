#include "dtrain/bucketer.h"

#include <algorithm>

#include "dtrain/error.h"

namespace dtrain {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& bytes, size_t cap_bytes) {
  std::vector<std::vector<size_t>> buckets;
  size_t filled = 0;
  for (size_t i = bytes.size(); i-- > 0;) {
    if (buckets.empty() || filled + bytes[i] > cap_bytes) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(i);
    filled += bytes[i];
  }
  return buckets;
}

Bucketer::Bucketer(const std::vector<size_t>& bytes, size_t cap_bytes)
    : buckets_(assign_buckets(bytes, cap_bytes)),
      bucket_of_(bytes.size()),
      position_of_(bytes.size()),
      pending_(buckets_.size()),
      ready_(bytes.size(), 0) {
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t k = 0; k < buckets_[b].size(); ++k) {
      bucket_of_[buckets_[b][k]] = b;
      position_of_[buckets_[b][k]] = k;
    }
  begin();
}

void Bucketer::begin() {
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].size();
  next_ = 0;
}

bool Bucketer::mark(size_t i, BucketReduction& reduction) {
  if (i >= ready_.size())
    throw InvalidUsage("Bucketer::mark: tensor " + std::to_string(i) + " out of range (" +
                       std::to_string(ready_.size()) + " tensors)");
  if (ready_[i]) return false;
  ready_[i] = 1;
  if (--pending_[bucket_of_[i]] == 0)
    while (next_ < buckets_.size() && pending_[next_] == 0) reduction.launch(next_++);
  return true;
}

}  // namespace dtrain
