#pragma once
// Paired trials between two groups of processes that cannot share a process:
// dtrain's ranks (with the raw-Gloo reference inside them) and Open MPI's ranks
// (dtrain-bench-mpi under mpirun). Both run at the same time and take turns
// on the machine through the bench's store, so trial k of dtrain and trial k
// of Open MPI run back to back, as the in-process references do.
//
// Both groups walk the same schedule of slots per size (schedule()); a group
// runs its own slots and, where the owner changes, the one that ran passes
// the machine (every rank sets a key) and the other takes it (every rank waits,
// blocked in the store, for all of those keys). A waiting group never spins.
// Used by bench/collectives_ranks.cc and bench/mpi_main.cc; header-only.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/store.h"

namespace dtrain::bench::coll {

enum class Side { Dtrain, Mpi };

// The slots of one size, in order: dtrain's set-up (correctness check,
// warm-up, sizing: it publishes iters/<i> and trials/<i>), Open MPI's
// warm-up, then the trials, dtrain first in even trials and Open MPI first in
// odd ones (ABBA: the order does not favour either, and every second change
// of owner needs no hand-off).
inline std::vector<Side> schedule(int trials) {
  std::vector<Side> s{Side::Dtrain, Side::Mpi};
  for (int k = 0; k < trials; ++k) {
    s.push_back(k % 2 ? Side::Mpi : Side::Dtrain);
    s.push_back(k % 2 ? Side::Dtrain : Side::Mpi);
  }
  return s;
}

// Index of slot j's trial in schedule() (-1 for the two set-up slots).
inline int trial_of_slot(size_t j) { return j < 2 ? -1 : static_cast<int>((j - 2) / 2); }

class Turns {
 public:
  // store: shared by both groups, on a connection of its own (a waiting
  // rank holds it). dtrain holds the machine first.
  Turns(std::shared_ptr<Store> store, Side me, int rank, int world, std::chrono::milliseconds limit)
      : store_(std::move(store)), me_(me), rank_(rank), world_(world), limit_(limit) {}

  // Before running a slot owned by `owner`: hands the machine over when the
  // owner changes. Call it for every slot, own or not, in schedule order.
  void before(Side owner) {
    if (owner == holder_) return;
    ++handoffs_;
    std::string key = "turn/" + std::to_string(handoffs_) + "/";
    if (holder_ == me_) {
      store_->set(key + std::to_string(rank_), std::string("1"));
    } else {
      std::vector<std::string> keys;
      for (int r = 0; r < world_; ++r) keys.push_back(key + std::to_string(r));
      store_->wait(keys, limit_);
    }
    holder_ = owner;
  }

 private:
  std::shared_ptr<Store> store_;
  Side me_;
  int rank_, world_;
  std::chrono::milliseconds limit_;
  Side holder_ = Side::Dtrain;
  uint64_t handoffs_ = 0;
};

}  // namespace dtrain::bench::coll
