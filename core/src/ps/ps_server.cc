// PsServer: ps_serve through the core's Work machinery, and a thread that
// watches the launcher's `ps/stop` key; start_server.
#include <condition_variable>
#include <thread>

#include "common/log.h"
#include "dtrain/error.h"
#include "plugin/backend_impl.h"
#include "ps/ps_internal.h"

namespace dtrain::ps {

using detail::submit_ps;
using dtrain::detail::CommState;

namespace {
constexpr auto kStopPoll = std::chrono::milliseconds(100);
}

struct PsServer::Impl {
  std::shared_ptr<CommState> comm;
  std::mutex mu;
  std::condition_variable cv;
  bool serving = false;
  bool served = false;
  std::string stop_reason;  // set by stop() before or during serve()

  void stop_backend(const std::string& why) { comm->table->ps_stop(comm->handle, why.c_str()); }
  void watch(const std::shared_ptr<Store>& root);
};

PsServer::PsServer(std::shared_ptr<CommState> state) : impl_(std::make_unique<Impl>()) {
  if (!state || !state->ps || state->role != Role::Server)
    throw InvalidUsage("PsServer needs a parameter-server communicator created with role server");
  detail::require_cap(*state, DT_CAP_PS_SERVER);
  impl_->comm = std::move(state);
}

PsServer::~PsServer() = default;

int PsServer::server_index() const { return impl_->comm->rank; }

void PsServer::Impl::watch(const std::shared_ptr<Store>& root) {
  bool warned = false;
  std::unique_lock<std::mutex> lk(mu);
  while (serving) {
    cv.wait_for(lk, kStopPoll, [&] { return !serving; });
    if (!serving) return;
    lk.unlock();
    std::optional<Bytes> v;
    try {
      v = root->try_get("ps/stop");
    } catch (const std::exception& e) {
      if (!warned)
        dtrain::detail::logger().warn("server {}: cannot read the job store's ps/stop key: {}", comm->rank, e.what());
      warned = true;
    }
    if (v) {
      std::string why(v->begin(), v->end());
      dtrain::detail::logger().info("server {}: the launcher asks the servers to stop ({})", comm->rank,
                                    why.empty() ? "no reason given" : why);
      stop_backend("the launcher asked: " + (why.empty() ? std::string("stop") : why));
      return;
    }
    lk.lock();
  }
}

void PsServer::serve() {
  auto& im = *impl_;
  auto& s = *im.comm;
  {
    std::lock_guard<std::mutex> lk(im.mu);
    if (im.serving || im.served) throw InvalidUsage("PsServer::serve() was already called");
    im.serving = true;
  }
  std::shared_ptr<Work> work;
  try {
    work = submit_ps(
        im.comm, "ps_serve", DT_CAP_PS_SERVER, "", CallOptions{std::chrono::milliseconds(-1)},
        [&](auto& opts, dt_work_h* h) { return s.table->ps_serve(s.handle, &opts, h); }, /*unbounded=*/true);
  } catch (...) {
    std::lock_guard<std::mutex> lk(im.mu);
    im.serving = false;
    throw;
  }
  std::string early;
  {
    std::lock_guard<std::mutex> lk(im.mu);
    early = im.stop_reason;
  }
  if (!early.empty()) im.stop_backend(early);
  std::thread watcher([&im, root = detail::root_store(s)] { im.watch(root); });
  auto done = [&] {
    {
      std::lock_guard<std::mutex> lk(im.mu);
      im.serving = false;
      im.served = true;
    }
    im.cv.notify_all();
    watcher.join();
  };
  try {
    work->wait();
  } catch (...) {
    done();
    throw;
  }
  done();
  dtrain::detail::logger().info("server {}: serving ended", s.rank);
}

void PsServer::stop(const std::string& reason) {
  auto& im = *impl_;
  bool serving;
  {
    std::lock_guard<std::mutex> lk(im.mu);
    if (im.stop_reason.empty()) im.stop_reason = reason.empty() ? "stopped" : reason;
    serving = im.serving;
  }
  if (serving) im.stop_backend(reason.empty() ? "stopped" : reason);
}

std::unique_ptr<PsServer> start_server(const std::shared_ptr<Backend>& backend, const CommOptions& options) {
  if (!backend) throw InvalidUsage("start_server: no backend");
  if (options.role != Role::Server) throw InvalidUsage("start_server: options.role must be server");
  if (options.num_servers < 1 || options.num_workers < 1)
    throw InvalidUsage("start_server: options.num_servers and options.num_workers must be >= 1 (got " +
                       std::to_string(options.num_servers) + " and " + std::to_string(options.num_workers) + ")");
  return std::make_unique<PsServer>(dtrain::detail::create_comm_state(backend, options));
}

}  // namespace dtrain::ps
