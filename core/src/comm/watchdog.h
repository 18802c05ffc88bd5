#pragma once

#include <memory>

#include "comm/comm_state.h"

namespace dtrain::detail {

// The one watchdog thread of the process. Every communicator registers with it;
// it publishes each communicator's progress heartbeat to the store, fails works
// whose deadline passed, and reaps dropped-but-unfinished works.
class Watchdog {
 public:
  static Watchdog& instance();
  void add(const std::shared_ptr<CommState>& comm);
  void adopt_orphan(std::shared_ptr<WorkState> w);
  void wake();
  // Publishes the heartbeat of every live communicator of the process (any
  // thread): a thread that holds up the watchdog's loop, as lost_peers()
  // does, keeps the process's other communicators alive to their peers.
  void publish_heartbeats();

 private:
  Watchdog();
  ~Watchdog();
  void run();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::detail
