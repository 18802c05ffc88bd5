#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <gloo/transport/unbound_buffer.h>

#include "dtrain/sdk/backend.h"
#include "dtrain/sdk/p2p.h"

namespace dtrain::gloo_backend {

// Gloo's own timeouts run this far past the op's deadline, so the core's
// watchdog normally reports first (naming the missing ranks).
constexpr std::chrono::milliseconds kGlooSlack{200};

// A send or recv posted on a Gloo unbound buffer. Gloo has no nonblocking
// check, so the communicator's P2pTracker (Mode::Thread) calls finish() on a
// thread of its own, oldest first; cancel() wakes it through Gloo's abortWait.
class P2pWork : public sdk::PostedWork {
 public:
  P2pWork(std::unique_ptr<::gloo::transport::UnboundBuffer> buf, bool is_send, int peer,
          sdk::Clock::time_point deadline)
      : buf_(std::move(buf)), is_send_(is_send), peer_(peer), deadline_(deadline) {}
  void finish() override;
  void cancel(const std::string& reason) override;

 private:
  std::string what() const;
  std::unique_ptr<::gloo::transport::UnboundBuffer> buf_;
  bool is_send_;
  int peer_;
  sdk::Clock::time_point deadline_;
};

// Gloo reports failures as exceptions; this maps one to a status and message.
[[noreturn]] void rethrow_gloo(const std::exception& e, const std::string& what);

}  // namespace dtrain::gloo_backend
