#pragma once

// Gradient bucketing, the framework-neutral part (c10d's Reducer with comm
// hooks): the one rule that groups tensors into buckets, and the bookkeeping
// that launches each bucket's reduction once all its tensors are ready, in
// bucket order on every rank. What a bucket holds and how it is reduced
// (all-reduce, 16-bit compressed all-reduce, reduce-scatter, on host or CUDA
// memory) is the BucketReduction's: the core's GradientBuckets (strategy.h)
// and the Fleet API's CUDA and ZeRO paths each plug one in.

#include <cstddef>
#include <vector>

namespace dtrain {

// The bucketing rule, the one place it is written: tensors in reverse
// registration order (the order backward produces gradients) fill buckets of
// at most cap_bytes; a tensor larger than cap_bytes gets a bucket of its own,
// and cap_bytes 0 gives one tensor per bucket. bytes[i] is tensor i's size.
// Returns the buckets, each the indices of its tensors in the order they sit.
// StrategyOptions::gradient_bucket_bytes() is the cap a strategy asks for.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& bytes, size_t cap_bytes);

// How a bucket is reduced across ranks (a comm hook). launch() is called in
// bucket order, the same order on every rank, by whichever thread made the
// bucket complete (a backward hook or finish), under the caller's lock.
class BucketReduction {
 public:
  virtual ~BucketReduction() = default;
  virtual void launch(size_t bucket) = 0;
};

// Which tensors of the step are ready, and which buckets are due. Not
// thread-safe: its owner calls it under its own lock (the lock that also
// guards the bucket memory the tensors are copied into).
class Bucketer {
 public:
  Bucketer(const std::vector<size_t>& bytes, size_t cap_bytes);

  size_t num_tensors() const { return bucket_of_.size(); }
  size_t num_buckets() const { return buckets_.size(); }
  // Tensor indices of bucket b, in the order they sit in it.
  const std::vector<size_t>& members(size_t b) const { return buckets_[b]; }
  size_t bucket_of(size_t i) const { return bucket_of_[i]; }
  size_t position_of(size_t i) const { return position_of_[i]; }  // index among its bucket's members

  // A new step: no tensor ready, no bucket launched.
  void begin();
  bool ready(size_t i) const { return ready_[i] != 0; }
  // Tensor i is ready; launches, through `reduction`, every bucket now
  // complete whose predecessors are all launched. False (and nothing done)
  // if i was already marked this step.
  bool mark(size_t i, BucketReduction& reduction);
  // Whether every bucket has been launched this step.
  bool all_launched() const { return next_ == buckets_.size(); }

 private:
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_, position_of_, pending_;
  std::vector<char> ready_;
  size_t next_ = 0;
};

}  // namespace dtrain
