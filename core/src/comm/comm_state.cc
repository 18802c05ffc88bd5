#include "comm/comm_state.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "comm/watchdog.h"
#include "common/log.h"
#include "dtrain/plugin_registry.h"
#include "plugin/backend_impl.h"

namespace dtrain::detail {

namespace {
int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
// A rank publishes its heartbeat this often; one older than kStaleHeartbeatMs
// is reported as unresponsive.
constexpr auto kHeartbeatEvery = std::chrono::milliseconds(250);
constexpr int64_t kStaleHeartbeatMs = 1500;

// Line 1: "peer" or "local"; line 2: unix time in ms; then the reason. The
// first error wins: the file is linked into place only where none exists (the
// launcher removes it before it starts a worker), so a consequence never
// replaces the root cause, from another thread or another communicator.
void write_error_file(const std::string& why, bool peer_lost) {
  static std::atomic<unsigned> attempt{0};
  const char* path = std::getenv("DTRAIN_ERROR_FILE");
  if (!path || !*path) return;
  std::string tmp = std::string(path) + ".tmp" + std::to_string(getpid()) + "." + std::to_string(attempt++);
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << (peer_lost ? "peer" : "local") << "\n" << unix_ms() << "\n" << why << "\n";
    if (!f) {
      std::remove(tmp.c_str());
      return;
    }
  }
  // A file system without hard links: the last error wins there instead.
  if (::link(tmp.c_str(), path) != 0 && errno != EEXIST && std::rename(tmp.c_str(), path) == 0) return;
  std::remove(tmp.c_str());
}
}  // namespace

WorkState::~WorkState() {
  if (tracked.load(std::memory_order_acquire)) comm->untrack(this);
  if (handle) comm->table->work_release(handle);
}

std::string WorkState::what() const {
  std::string s = op_name;
  if (!label.empty()) return s + " (" + label + ")";
  if (collective) s += " #" + std::to_string(seq);
  if (dtype >= 0 || op_detail) {
    s += " (";
    if (dtype >= 0) s += std::string(dtype_name(static_cast<DType>(dtype))) + " x " + std::to_string(count);
    if (op_detail) s += std::string(dtype >= 0 ? ", " : "") + op_detail;
    s += ")";
  }
  return s;
}

bool WorkState::finished() { return done.load(std::memory_order_acquire); }

bool WorkState::finish(std::exception_ptr err, const std::function<void()>& before_done) {
  if (claimed.exchange(true, std::memory_order_acq_rel)) {
    // The winner is between its claim and done: callers rely on the work
    // being finished when this returns.
    while (!done.load(std::memory_order_acquire)) std::this_thread::yield();
    return false;
  }
  error = std::move(err);
  if (before_done) {
    comm->untrack(this);  // so that poisoning does not wait for this work
    before_done();
  }
  done.store(true, std::memory_order_release);
  comm->untrack(this);
  return true;
}

namespace {
// The one mapping between the ABI's statuses and the core's error kinds,
// lossless both ways: status -> kind -> status is the identity, and every
// kind but Config (a configuration the core itself rejects, reported to a
// plugin as invalid usage) comes back as itself.
struct KindStatus {
  ErrorKind kind;
  dt_status_t status;
};
constexpr KindStatus kKindStatus[] = {
    {ErrorKind::InvalidUsage, DT_ERR_INVALID_USAGE},
    {ErrorKind::Io, DT_ERR_SYSTEM},
    {ErrorKind::Internal, DT_ERR_INTERNAL},
    {ErrorKind::Remote, DT_ERR_REMOTE},
    {ErrorKind::Timeout, DT_ERR_TIMEOUT},
    {ErrorKind::NotSupported, DT_ERR_NOT_SUPPORTED},
    {ErrorKind::Aborted, DT_ERR_ABORTED},
};
}  // namespace

ErrorKind kind_of_status(dt_status_t st) {
  for (auto& ks : kKindStatus)
    if (ks.status == st) return ks.kind;
  return ErrorKind::Internal;
}

dt_status_t status_of_kind(ErrorKind kind) {
  if (kind == ErrorKind::Config) return DT_ERR_INVALID_USAGE;
  for (auto& ks : kKindStatus)
    if (ks.kind == kind) return ks.status;
  return DT_ERR_INTERNAL;
}

std::exception_ptr make_backend_error(const std::string& backend, dt_status_t st, const std::string& msg) {
  std::string m = "backend '" + backend + "': " + (msg.empty() ? "operation failed" : msg);
  switch (kind_of_status(st)) {
    case ErrorKind::InvalidUsage: return std::make_exception_ptr(InvalidUsage(m));
    case ErrorKind::Io: return std::make_exception_ptr(IoError(m));
    case ErrorKind::Remote: return std::make_exception_ptr(RemoteError(m));
    case ErrorKind::Timeout: return std::make_exception_ptr(TimeoutError(m));
    case ErrorKind::NotSupported: return std::make_exception_ptr(NotSupported(m));
    case ErrorKind::Aborted: return std::make_exception_ptr(AbortedError(m));
    default: return std::make_exception_ptr(InternalError(m));
  }
}

CommState::~CommState() {
  if (handle) {
    if (poisoned.load()) table->comm_abort(handle, poison_reason.c_str());
    table->comm_destroy(handle);
  }
}

void CommState::settle(const std::shared_ptr<WorkState>& w, dt_status_t st) {
  if (st == DT_OK) {
    w->finish(nullptr);
  } else if (st == DT_ERR_TIMEOUT) {
    expire(w, w->ps ? table->work_error(w->handle) : nullptr);
  } else {
    fail(w, st, table->work_error(w->handle));
  }
}

void CommState::track(const std::shared_ptr<WorkState>& w) {
  std::lock_guard<SpinLock> lk(mu);
  w->next = inflight;
  if (inflight) inflight->prev = w.get();
  inflight = w.get();
  w->tracked.store(true, std::memory_order_relaxed);
}

void CommState::untrack(WorkState* w) {
  std::lock_guard<SpinLock> lk(mu);
  if (!w->tracked.load(std::memory_order_relaxed)) return;
  if (w->prev)
    w->prev->next = w->next;
  else
    inflight = w->next;
  if (w->next) w->next->prev = w->prev;
  w->prev = w->next = nullptr;
  w->tracked.store(false, std::memory_order_release);
}

std::vector<std::shared_ptr<WorkState>> CommState::inflight_works() {
  // Reserved first: a throwing push_back would drop references under mu.
  size_t n = 0;
  for (WorkState* p = inflight; p; p = p->next) ++n;
  std::vector<std::shared_ptr<WorkState>> out;
  out.reserve(n);
  for (WorkState* p = inflight; p; p = p->next)
    if (auto w = p->weak_from_this().lock()) out.push_back(std::move(w));
  return out;
}

std::string CommState::reason() {
  std::lock_guard<SpinLock> lk(mu);
  return poison_reason;
}

void CommState::poison(const std::string& why, bool peer_lost) {
  std::vector<std::shared_ptr<WorkState>> victims;
  {
    std::lock_guard<SpinLock> lk(mu);
    if (poisoned.load()) return;
    // Before anyone can see the communicator poisoned (and exit).
    write_error_file(why, peer_lost);
    poison_reason = why;
    poisoned.store(true);
    victims = inflight_works();
  }
  logger().error("communicator '{}' (backend '{}') rank {} aborted: {}", name, backend->name(), rank, why);
  table->comm_abort(handle, why.c_str());
  for (auto& w : victims) w->finish(std::make_exception_ptr(AbortedError(w->what() + " aborted: " + why)));
}

void CommState::expire(const std::shared_ptr<WorkState>& w, const char* backend_msg) {
  if (w->finished()) return;
  std::string msg;
  if (poisoned.load()) {
    msg = reason();
  } else {
    msg = diagnose(*w, backend_msg);
  }
  // The error file is written before the waiter can see its work fail and exit.
  if (!poisoned.load()) write_error_file(msg, true);
  w->finish(std::make_exception_ptr(TimeoutError(msg)), [&] { poison(msg, true); });
}

void CommState::fail(const std::shared_ptr<WorkState>& w, dt_status_t st, const std::string& message) {
  if (w->finished()) return;
  // A server refused one request (bad dimension, unknown table, too large):
  // that op fails, the client stays usable.
  if (w->ps && (st == DT_ERR_INVALID_USAGE || st == DT_ERR_NOT_SUPPORTED)) {
    w->finish(make_backend_error(backend->name(), st, w->what() + " failed: " + message));
    return;
  }
  // A peer that reaches the same deadline aborts and closes its connections;
  // a transport failure that close to our own deadline is that timeout.
  bool transport = st == DT_ERR_REMOTE || st == DT_ERR_SYSTEM || st == DT_ERR_ABORTED;
  if (transport && !poisoned.load() && Clock::now() + std::chrono::milliseconds(250) >= w->deadline()) {
    expire(w);
    return;
  }
  std::string why = poisoned.load()
                        ? reason()
                        : who() + ": " + w->what() + " failed in backend '" + backend->name() + "': " + message;
  std::string status;
  if (transport && !poisoned.load()) {
    status = " [" + lost_peers(*w) + "]";
    why += status;
  }
  auto err = poisoned.load() ? std::make_exception_ptr(AbortedError(w->what() + " aborted: " + why))
                             : make_backend_error(backend->name(), st, w->what() + " failed: " + message + status);
  if (!poisoned.load()) write_error_file(why, transport);
  w->finish(err, [&] { poison(why, transport); });
}

void CommState::publish_heartbeat(bool force) {
  // At most every kHeartbeatEvery, moved or not. Peers read it only to explain
  // an op that timed out, and a rank that stopped at a collective publishes
  // where it stopped within kHeartbeatEvery; each write is a round trip to the
  // store server that wakes a thread on both sides while the ranks train (at
  // every 50 ms watchdog tick it was ~10 writes per training step on rank 0).
  auto now = Clock::now();
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  int64_t last = last_publish_ns.load();
  if (!force && now_ns - last < std::chrono::nanoseconds(kHeartbeatEvery).count()) return;
  if (!last_publish_ns.compare_exchange_strong(last, now_ns)) return;  // another thread publishes now
  try {
    store->set(heartbeat_key(rank), std::to_string(coll_seq.load()) + " " + std::to_string(unix_ms()));
  } catch (const std::exception& e) {
    int64_t mine = now_ns;
    last_publish_ns.compare_exchange_strong(mine, last);  // the next tick tries again
    logger().debug("heartbeat of rank {} not published: {}", rank, e.what());
  }
}

std::string CommState::who() const {
  if (!ps) return "rank " + std::to_string(rank) + " of " + std::to_string(size);
  if (role == Role::Server) return "server " + std::to_string(rank) + " of " + std::to_string(num_servers);
  return "worker " + std::to_string(rank) + " of " + std::to_string(size);
}

namespace {

struct PeerBeat {
  uint64_t seq = 0;  // the last collective it reported
  int64_t at_ms = 0;
};

// `who`'s last heartbeat at `key`; none (and why, appended to missing) when the
// store cannot say or it never reported.
std::optional<PeerBeat> last_beat(Store& store, const std::string& key, const std::string& who,
                                  std::vector<std::string>& missing) {
  std::optional<Bytes> v;
  try {
    v = store.try_get(key);
  } catch (const std::exception& e) {
    missing.push_back(who + " (store unreachable: " + e.what() + ")");
    return std::nullopt;
  }
  if (!v) {
    missing.push_back(who + " (never reported progress)");
    return std::nullopt;
  }
  PeerBeat b;
  std::istringstream is(std::string(v->begin(), v->end()));
  is >> b.seq >> b.at_ms;
  return b;
}

}  // namespace

std::string CommState::server_status() {
  std::vector<std::string> missing;
  int64_t now_ms = unix_ms();
  for (int i = 0; i < num_servers; ++i) {
    auto beat = last_beat(*store, heartbeat_key(Role::Server, i), "server " + std::to_string(i), missing);
    if (beat && now_ms - beat->at_ms > kStaleHeartbeatMs)
      missing.push_back("server " + std::to_string(i) + " (unresponsive: no heartbeat for " +
                        std::to_string(now_ms - beat->at_ms) + " ms)");
  }
  if (missing.empty()) return "every server is alive";
  std::string out;
  for (size_t i = 0; i < missing.size(); ++i) out += (i ? ", " : "") + missing[i];
  return out;
}

std::string CommState::lost_peers(const WorkState& w) {
  if (ps) return peer_status(w);
  std::vector<int> peers;
  for (int r = 0; r < size; ++r)
    if (r != rank && (w.peer < 0 || r == w.peer)) peers.push_back(r);
  auto stamp = [&](int r) -> std::string {
    try {
      auto v = store->try_get(heartbeat_key(r));
      return v ? std::string(v->begin(), v->end()) : std::string();
    } catch (const std::exception&) {
      return std::string();
    }
  };
  std::vector<std::string> first;
  for (int r : peers) first.push_back(stamp(r));
  std::vector<bool> moved(peers.size(), false);
  const auto until = Clock::now() + 3 * kHeartbeatEvery;
  while (Clock::now() < until) {
    Watchdog::instance().publish_heartbeats();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    bool all = true;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (!moved[i]) moved[i] = !first[i].empty() && stamp(peers[i]) != first[i];
      all = all && moved[i];
    }
    if (all) return peer_status(w);
  }
  std::string out;
  for (size_t i = 0; i < peers.size(); ++i)
    if (!moved[i]) out += std::string(out.empty() ? "" : ", ") + "rank " + std::to_string(peers[i]);
  return "lost " + out + " (no heartbeat since the failure: the process died, or lost the job's store)";
}

std::string CommState::peer_status(const WorkState& w) {
  if (ps) return role == Role::Worker ? server_status() : "a server's own op";
  std::vector<int> peers;
  if (w.peer >= 0) {
    peers.push_back(w.peer);
  } else {
    for (int r = 0; r < size; ++r)
      if (r != rank) peers.push_back(r);
  }
  std::vector<std::string> missing;
  int64_t now_ms = unix_ms();
  for (int r : peers) {
    auto beat = last_beat(*store, heartbeat_key(r), "rank " + std::to_string(r), missing);
    if (!beat) continue;
    const uint64_t seq = beat->seq;
    int64_t age = now_ms - beat->at_ms;
    if (age > kStaleHeartbeatMs) {
      missing.push_back("rank " + std::to_string(r) + " (unresponsive: no heartbeat for " + std::to_string(age) +
                        " ms, last at collective #" + std::to_string(seq) + ")");
    } else if (w.peer < 0 && seq < w.seq) {
      missing.push_back("rank " + std::to_string(r) + " (has not reached collective #" + std::to_string(w.seq) +
                        "; it is at #" + std::to_string(seq) + ")");
    } else if (w.peer >= 0) {
      missing.push_back("rank " + std::to_string(r) + " (peer of this point-to-point op, at collective #" +
                        std::to_string(seq) + ")");
    }
  }
  if (missing.empty()) return "every rank reached it";
  std::string out = "waiting for ";
  for (size_t i = 0; i < missing.size(); ++i) out += (i ? ", " : "") + missing[i];
  return out;
}

std::string CommState::diagnose(const WorkState& w, const char* backend_msg) {
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - w.submitted).count();
  std::ostringstream os;
  os << who() << ": " << w.what() << " on backend '" << backend->name() << "' timed out after " << waited << " ms; ";
  if (backend_msg && *backend_msg) {
    os << backend_msg << ". The " << (ps ? "parameter-server client" : "communicator") << " is aborted.";
    return os.str();
  }
  std::string peers = peer_status(w);
  if (ps) {
    os << (peers == "every server is alive" ? "every server is alive, so a server did not answer in time"
                                            : "waiting for " + peers);
    os << ". The parameter-server client is aborted.";
  } else {
    os << (peers == "every rank reached it" ? "every rank reached it, so the transport stalled" : peers);
    os << ". The communicator is aborted; create a new one to continue.";
  }
  return os.str();
}

}  // namespace dtrain::detail
