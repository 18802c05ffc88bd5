#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <gloo/transport/unbound_buffer.h>

#include "dtrain/sdk/backend.h"

namespace dtrain::gloo_backend {

// A posted send or recv on a Gloo unbound buffer.
class P2pWork : public sdk::Work {
 public:
  P2pWork(std::unique_ptr<::gloo::transport::UnboundBuffer> buf, bool is_send, int peer,
          std::chrono::steady_clock::time_point deadline)
      : buf_(std::move(buf)), is_send_(is_send), peer_(peer), deadline_(deadline) {}
  // Blocks in Gloo until the transfer is done, failed, or aborted.
  void finish();
  void abort_wait();

 private:
  std::unique_ptr<::gloo::transport::UnboundBuffer> buf_;
  bool is_send_;
  int peer_;
  std::chrono::steady_clock::time_point deadline_;
};

// Waits for posted point-to-point transfers, oldest first, on one thread, so
// callers can test() them and the core's watchdog can abort them. Waiting in
// order cannot deadlock: every transfer is already posted.
class P2pCompleter {
 public:
  P2pCompleter();
  ~P2pCompleter();
  void add(std::shared_ptr<P2pWork> w);
  void abort(const std::string& reason);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<P2pWork>> pending_;
  std::shared_ptr<P2pWork> current_;
  bool stop_ = false;
  bool aborted_ = false;
  std::string reason_;
  std::thread thread_;
};

// Gloo reports failures as exceptions; this maps one to a status and message.
[[noreturn]] void rethrow_gloo(const std::exception& e, const std::string& what);

}  // namespace dtrain::gloo_backend
