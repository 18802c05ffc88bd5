#pragma once

#include <string>
#include <vector>

#include "dtrain/sdk/support.h"

namespace example {

// One collective round through the rendezvous store: every rank publishes a
// blob under the round's key, reads the blobs it needs, and the last rank to
// finish reading deletes the round's keys.
class StoreRound {
 public:
  StoreRound(const dtrain::sdk::Store& store, uint64_t round, int rank, int size, int64_t timeout_ms)
      : store_(store), prefix_("c" + std::to_string(round) + "/"), rank_(rank), size_(size), timeout_ms_(timeout_ms) {}
  void publish(const void* data, size_t bytes) const;
  std::string read(int from) const;
  // Marks this rank done with the round; the last one cleans up.
  void finish() const;

 private:
  const dtrain::sdk::Store& store_;
  std::string prefix_;
  int rank_;
  int size_;
  int64_t timeout_ms_;
};

}  // namespace example
