#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "dtrain/sdk/support.h"

namespace example {

// store.get(key) in short slices until deadline (DT_ERR_TIMEOUT) or until
// aborted is set (DT_ERR_ABORTED): the store's own wait cannot be cut short.
std::string get_until(const dtrain::sdk::Store& store, const std::string& key, dtrain::sdk::Clock::time_point deadline,
                      const std::atomic<bool>& aborted);

// One collective round through the rendezvous store: every rank publishes a
// blob under the round's key, reads the blobs it needs, and the last rank to
// finish reading deletes the round's keys.
class StoreRound {
 public:
  StoreRound(const dtrain::sdk::Store& store, uint64_t round, int rank, int size,
             dtrain::sdk::Clock::time_point deadline, const std::atomic<bool>& aborted)
      : store_(store),
        prefix_("c" + std::to_string(round) + "/"),
        rank_(rank),
        size_(size),
        deadline_(deadline),
        aborted_(aborted) {}
  void publish(const void* data, size_t bytes) const;
  std::string read(int from) const;
  // Marks this rank done with the round; the last one cleans up.
  void finish() const;

 private:
  const dtrain::sdk::Store& store_;
  std::string prefix_;
  int rank_;
  int size_;
  dtrain::sdk::Clock::time_point deadline_;
  const std::atomic<bool>& aborted_;
};

}  // namespace example
