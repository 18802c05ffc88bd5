#include "communicator.h"

#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

namespace dtrain::ucx_backend {

namespace {

constexpr uint64_t kCollBit = 1ull << 63;
constexpr int kSrcShift = 40;
constexpr uint64_t kSeqMask = (1ull << kSrcShift) - 1;
constexpr uint64_t kHelloSeq = kSeqMask;  // the connection handshake
char g_dummy;                              // address for zero-byte transfers

std::string status_text(ucs_status_t st) { return ucs_status_string(st); }
std::string host_identity();

void check_ucs(ucs_status_t st, const std::string& what) {
  if (st != UCS_OK) sdk::fail(DT_ERR_SYSTEM, "ucx: " + what + " failed: " + status_text(st));
}

void ep_error(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* peer = static_cast<int*>(arg);
  sdk::Log::warn("ucx: connection to rank " + std::to_string(*peer) + " failed: " + status_text(st));
}

// ---- reductions: one loop per (type, op), written for the vectoriser ----

struct Sum {
  template <typename T> static T f(T a, T b) { return static_cast<T>(a + b); }
};
struct Prod {
  template <typename T> static T f(T a, T b) { return static_cast<T>(a * b); }
};
struct Max {
  template <typename T> static T f(T a, T b) { return a < b ? b : a; }
};
struct Min {
  template <typename T> static T f(T a, T b) { return b < a ? b : a; }
};

// c may equal a or b exactly, or be disjoint from both: no loop-carried
// dependence either way.
template <typename T, typename Op>
void kernel(void* c, const void* a, const void* b, size_t n) {
  T* pc = static_cast<T*>(c);
  const T* pa = static_cast<const T*>(a);
  const T* pb = static_cast<const T*>(b);
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) pc[i] = Op::f(pa[i], pb[i]);
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), typename Op>
void kernel16(void* c, const void* a, const void* b, size_t n) {
  auto* pc = static_cast<uint16_t*>(c);
  auto* pa = static_cast<const uint16_t*>(a);
  auto* pb = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) pc[i] = FromF(Op::f(ToF(pa[i]), ToF(pb[i])));
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename Op>
ReduceFn pick_type(int32_t dtype) {
  switch (dtype) {
    case DT_DTYPE_F32: return kernel<float, Op>;
    case DT_DTYPE_F64: return kernel<double, Op>;
    case DT_DTYPE_I8: return kernel<int8_t, Op>;
    case DT_DTYPE_U8: return kernel<uint8_t, Op>;
    case DT_DTYPE_I32: return kernel<int32_t, Op>;
    case DT_DTYPE_I64: return kernel<int64_t, Op>;
    case DT_DTYPE_F16: return kernel16<sdk::half_to_float, sdk::float_to_half, Op>;
    case DT_DTYPE_BF16: return kernel16<sdk::bf16_to_float, sdk::float_to_bf16, Op>;
  }
  sdk::fail(DT_ERR_INVALID_USAGE, "ucx: unknown dtype code " + std::to_string(dtype));
}

ReduceFn reduce_fn(int32_t dtype, int32_t op) {
  switch (op) {
    case DT_OP_SUM: case DT_OP_AVG: return pick_type<Sum>(dtype);
    case DT_OP_PROD: return pick_type<Prod>(dtype);
    case DT_OP_MAX: return pick_type<Max>(dtype);
    case DT_OP_MIN: return pick_type<Min>(dtype);
  }
  sdk::fail(DT_ERR_INVALID_USAGE, "ucx: unknown reduction op code " + std::to_string(op));
}

Algorithm parse_algorithm(const std::string& s) {
  if (s == "auto") return Algorithm::Auto;
  if (s == "recursive_doubling") return Algorithm::RecursiveDoubling;
  if (s == "ring") return Algorithm::Ring;
  sdk::fail(DT_ERR_INVALID_USAGE,
            "ucx.algorithm = \"" + s + "\" is not known; use \"auto\", \"recursive_doubling\" or \"ring\"");
}

void check_cpu(const dt_buffer_v1_t& b) {
  if (b.device_type != DT_DEVICE_CPU) sdk::fail(DT_ERR_NOT_SUPPORTED, "ucx backend works on CPU buffers only");
}

char* at(void* p, size_t off) { return static_cast<char*>(p) + off; }
const char* at(const void* p, size_t off) { return static_cast<const char*>(p) + off; }

void put_field(std::string& out, const std::string& v) {
  uint32_t n = static_cast<uint32_t>(v.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out += v;
}

std::string get_field(const std::string& in, size_t& pos, int rank) {
  uint32_t n = 0;
  if (pos + sizeof(n) > in.size()) sdk::fail(DT_ERR_INTERNAL, "ucx: malformed address of rank " + std::to_string(rank));
  std::memcpy(&n, in.data() + pos, sizeof(n));
  pos += sizeof(n);
  if (pos + n > in.size()) sdk::fail(DT_ERR_INTERNAL, "ucx: malformed address of rank " + std::to_string(rank));
  std::string v = in.substr(pos, n);
  pos += n;
  return v;
}

// Requests of one algorithm step; anything still posted when the step is
// left by an exception is cancelled and released.
class Batch {
 public:
  explicit Batch(Fabric& f) : f_(f) {}
  ~Batch() {
    for (auto& r : reqs) f_.discard(r);
  }
  Request& add(Request r) {
    reqs.push_back(r);
    return reqs.back();
  }
  void wait(Clock::time_point deadline, const char* what) { f_.wait_all(reqs.data(), reqs.size(), deadline, what); }
  std::vector<Request> reqs;

 private:
  Fabric& f_;
};

}  // namespace

// ---------------------------------------------------------------- Fabric ----

uint64_t Fabric::p2p_tag(int src, int32_t tag) {
  return (static_cast<uint64_t>(src) << kSrcShift) | static_cast<uint32_t>(tag);
}

uint64_t Fabric::coll_tag(int src, uint64_t seq) {
  return kCollBit | (static_cast<uint64_t>(src) << kSrcShift) | (seq & kSeqMask);
}

Fabric::Fabric(const sdk::CommInit& init, const std::string& tls, const std::string& net_devices,
               ErrorHandling errors, std::chrono::microseconds spin, size_t mailbox_bytes,
               const std::string& fingerprint)
    : rank_(init.rank), size_(init.world_size), spin_(spin) {
  if (size_ > (1 << 22)) sdk::fail(DT_ERR_NOT_SUPPORTED, "ucx: at most 4194304 ranks");
  ucp_config_t* cfg = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &cfg), "reading the UCX configuration");
  ucp_config_modify(cfg, "WARN_UNUSED_ENV_VARS", "n");
  if (!tls.empty() && ucp_config_modify(cfg, "TLS", tls.c_str()) != UCS_OK) {
    ucp_config_release(cfg);
    sdk::fail(DT_ERR_INVALID_USAGE, "ucx.tls = \"" + tls + "\" is not a valid UCX transport list");
  }
  if (!net_devices.empty() && ucp_config_modify(cfg, "NET_DEVICES", net_devices.c_str()) != UCS_OK) {
    ucp_config_release(cfg);
    sdk::fail(DT_ERR_INVALID_USAGE, "ucx.net_devices = \"" + net_devices + "\" is not a valid UCX device list");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP | (mailbox_bytes ? UCP_FEATURE_RMA : 0);
  params.mt_workers_shared = 0;
  ucs_status_t st = ucp_init(&params, cfg, &context_);
  ucp_config_release(cfg);
  check_ucs(st, "ucp_init (transports \"" + (tls.empty() ? std::string("default") : tls) + "\", devices \"" +
                    (net_devices.empty() ? std::string("default") : net_devices) + "\")");
  try {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    check_ucs(ucp_worker_create(context_, &wp, &worker_), "creating the UCP worker");
    check_ucs(ucp_worker_get_efd(worker_, &efd_), "getting the worker's event fd");
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epfd_ < 0 || wake_fd_ < 0) sdk::fail(DT_ERR_SYSTEM, "ucx: epoll/eventfd failed");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = efd_;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, efd_, &ev);
    ev.data.fd = wake_fd_;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);

    ucp_address_t* addr = nullptr;
    size_t len = 0;
    check_ucs(ucp_worker_get_address(worker_, &addr, &len), "getting the worker address");
    std::string my_host = host_identity();
    std::string mine;
    put_field(mine, my_host);
    put_field(mine, std::string(reinterpret_cast<const char*>(addr), len));
    ucp_worker_release_address(worker_, addr);
    put_field(mine, size_ > 1 && mailbox_bytes ? map_mailbox(mailbox_bytes) : std::string());
    put_field(mine, fingerprint);
    init.store.set("ucx/addr/" + std::to_string(rank_), mine);
    std::vector<std::string> peer_rkeys(size_);
    bool all_local = true;
    int local_peers = 0;

    peer_ids_.resize(size_);
    eps_.assign(size_, nullptr);
    for (int p = 0; p < size_; ++p) {
      peer_ids_[p] = p;
      if (p == rank_) continue;
      std::string theirs = init.store.get("ucx/addr/" + std::to_string(p), init.timeout_ms);
      size_t pos = 0;
      std::string their_host = get_field(theirs, pos, p), their_addr = get_field(theirs, pos, p);
      peer_rkeys[p] = get_field(theirs, pos, p);
      std::string their_print = get_field(theirs, pos, p);
      // Every rank must pick the same algorithm and mailbox layout for every op.
      if (their_print != fingerprint)
        sdk::fail(DT_ERR_INVALID_USAGE, "ucx: rank " + std::to_string(p) + " runs with options {" + their_print +
                                            "} but rank " + std::to_string(rank_) + " with {" + fingerprint +
                                            "}; give every rank the same [ucx] table");
      bool same_host = their_host == my_host;
      all_local = all_local && same_host;
      local_peers += same_host ? 1 : 0;
      // UCX 1.13 keeps shared memory and CMA only without peer-failure
      // handling; peers on other hosts get it (their loss then fails the op
      // at once instead of at the core's deadline).
      bool peer_mode = errors == ErrorHandling::Peer || (errors == ErrorHandling::Auto && !same_host);
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      ep.address = reinterpret_cast<const ucp_address_t*>(their_addr.data());
      ep.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      if (peer_mode) ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_handler.cb = ep_error;
      ep.err_handler.arg = &peer_ids_[p];
      check_ucs(ucp_ep_create(worker_, &ep, &eps_[p]), "connecting to rank " + std::to_string(p));
    }
    // Handshake: a zero-byte message each way with every peer, so the
    // communicator exists only once every rank is reachable.
    auto deadline = Clock::now() + std::chrono::milliseconds(init.timeout_ms > 0 ? init.timeout_ms : 300000);
    Batch b(*this);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      b.add(irecv(p, coll_tag(p, kHelloSeq), nullptr, 0));
      b.add(isend(p, coll_tag(rank_, kHelloSeq), nullptr, 0));
    }
    b.wait(deadline, "connecting");
    if (size_ > 1 && mailbox_bytes) attach_mailboxes(init, all_local, peer_rkeys);
    sdk::Log::debug("ucx: rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " connected: " +
                    std::to_string(local_peers) + " peer(s) on this host, " +
                    std::to_string(size_ - 1 - local_peers) + " on other hosts; transports \"" +
                    (tls.empty() ? std::string("default") : tls) + "\", devices \"" +
                    (net_devices.empty() ? std::string("default") : net_devices) + "\"; shared-memory mailboxes " +
                    (mbox_mine_ ? "on" : "off"));
  } catch (...) {
    close_all();
    throw;
  }
}

Fabric::~Fabric() { close_all(); }

std::string Fabric::map_mailbox(size_t bytes) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  if (ucp_mem_map(context_, &mp, &mbox_memh_) != UCS_OK) {
    mbox_memh_ = nullptr;
    return {};
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  void* packed = nullptr;
  size_t len = 0;
  if (ucp_mem_query(mbox_memh_, &attr) != UCS_OK || ucp_rkey_pack(context_, mbox_memh_, &packed, &len) != UCS_OK)
    return {};
  mbox_mine_ = static_cast<char*>(attr.address);
  std::memset(mbox_mine_, 0, MailboxLayout::kRing);
  uint64_t raddr = reinterpret_cast<uint64_t>(attr.address);
  std::string out(reinterpret_cast<const char*>(&raddr), sizeof(raddr));
  out.append(static_cast<const char*>(packed), len);
  ucp_rkey_buffer_release(packed);
  return out;
}

void Fabric::attach_mailboxes(const sdk::CommInit& init, bool all_local, const std::vector<std::string>& rkeys) {
  bool ok = all_local && mbox_mine_;
  rkeys_.assign(size_, nullptr);
  mbox_of_.assign(size_, nullptr);
  for (int p = 0; p < size_ && ok; ++p) {
    if (p == rank_) {
      mbox_of_[p] = mbox_mine_;
      continue;
    }
    ok = rkeys[p].size() > sizeof(uint64_t);
    if (!ok) break;
    uint64_t raddr = 0;
    std::memcpy(&raddr, rkeys[p].data(), sizeof(raddr));
    void* local = nullptr;
    ok = ucp_ep_rkey_unpack(eps_[p], rkeys[p].data() + sizeof(raddr), &rkeys_[p]) == UCS_OK &&
         ucp_rkey_ptr(rkeys_[p], raddr, &local) == UCS_OK;
    mbox_of_[p] = static_cast<char*>(local);
  }
  // Every rank must take the same path: publish, then agree.
  init.store.set("ucx/shm/" + std::to_string(rank_), ok ? "1" : "0");
  bool all = true;
  for (int p = 0; p < size_; ++p)
    all = all && init.store.get("ucx/shm/" + std::to_string(p), init.timeout_ms) == "1";
  if (!all) {
    mbox_of_.clear();
    mbox_mine_ = nullptr;
  }
}

void Fabric::backoff(Clock::time_point start, Clock::time_point deadline, int peer, const char* what) {
  auto now = Clock::now();
  if (aborted()) sdk::fail(DT_ERR_ABORTED, std::string("ucx: ") + what + " aborted");
  if (now >= deadline) fail_timeout(peer, what);
  auto spent = now - start;
  if (spent < spin_) return;
  usleep(20);
}

void Fabric::close_all() {
  for (auto& k : rkeys_)
    if (k) ucp_rkey_destroy(k);
  rkeys_.clear();
  mbox_of_.clear();
  for (auto& ep : eps_) {
    if (!ep) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(r)) {
      auto until = Clock::now() + std::chrono::milliseconds(200);
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < until) ucp_worker_progress(worker_);
      ucp_request_free(r);
    }
    ep = nullptr;
  }
  if (mbox_memh_) ucp_mem_unmap(context_, mbox_memh_);
  mbox_memh_ = nullptr;
  if (worker_) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  if (context_) ucp_cleanup(context_);
  context_ = nullptr;
  if (epfd_ >= 0) close(epfd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  epfd_ = wake_fd_ = -1;
}

Request Fabric::isend(int peer, uint64_t tag, const void* ptr, size_t bytes) {
  Request r;
  r.peer = peer;
  r.is_send = true;
  ucp_request_param_t prm{};
  void* h = ucp_tag_send_nbx(eps_[peer], bytes ? ptr : &g_dummy, bytes, tag, &prm);
  if (h == nullptr) r.status = UCS_OK;
  else if (UCS_PTR_IS_ERR(h)) r.status = UCS_PTR_STATUS(h);
  else r.handle = h;
  return r;
}

Request Fabric::irecv(int peer, uint64_t tag, void* ptr, size_t bytes) {
  Request r;
  r.peer = peer;
  ucp_request_param_t prm{};
  void* h = ucp_tag_recv_nbx(worker_, bytes ? ptr : &g_dummy, bytes, tag, ~0ull, &prm);
  if (h == nullptr) r.status = UCS_OK;
  else if (UCS_PTR_IS_ERR(h)) r.status = UCS_PTR_STATUS(h);
  else r.handle = h;
  return r;
}

bool Fabric::poll(Request& r) {
  if (r.done()) return true;
  ucs_status_t st = ucp_request_check_status(r.handle);
  if (st == UCS_INPROGRESS) return false;
  ucp_request_free(r.handle);
  r.handle = nullptr;
  r.status = st;
  return true;
}

void Fabric::discard(Request& r) {
  if (!r.handle) return;
  if (!poll(r)) {
    if (!r.is_send) ucp_request_cancel(worker_, r.handle);
    ucp_request_free(r.handle);
    r.handle = nullptr;
    r.status = UCS_ERR_CANCELED;
  }
}

bool Fabric::progress() { return ucp_worker_progress(worker_) != 0; }

void Fabric::abort() {
  aborted_.store(true);
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof(one));
}

void Fabric::check(const Request& r, const char* what) const {
  if (r.status == UCS_OK) return;
  std::string dir = r.is_send ? " sending to rank " : " receiving from rank ";
  if (r.status == UCS_ERR_MESSAGE_TRUNCATED)
    sdk::fail(DT_ERR_INVALID_USAGE, std::string("ucx: ") + what + dir + std::to_string(r.peer) +
                                        ": the message is larger than the buffer (counts differ between ranks?)");
  if (r.status == UCS_ERR_CANCELED && aborted()) sdk::fail(DT_ERR_ABORTED, std::string("ucx: ") + what + " aborted");
  sdk::fail(DT_ERR_REMOTE, std::string("ucx: ") + what + dir + std::to_string(r.peer) + " failed: " +
                               status_text(r.status) + " (rank " + std::to_string(r.peer) + " lost?)");
}

void Fabric::fail_timeout(int peer, const char* what) const {
  sdk::fail(DT_ERR_TIMEOUT, std::string("ucx: ") + what + " timed out" +
                                (peer >= 0 ? " waiting for rank " + std::to_string(peer) : std::string()));
}

void Fabric::block(Clock::time_point deadline) {
  ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  int ms = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 2)));
  if (st != UCS_OK) {
    usleep(50);
    return;
  }
  epoll_event evs[2];
  epoll_wait(epfd_, evs, 2, ms);
}

void Fabric::progress_until(const std::function<bool()>& done, Clock::time_point deadline, const char* what,
                            const std::function<int()>& waiting_for) {
  if (done()) return;
  Clock::time_point start{};  // read lazily: most waits end within a few polls
  for (unsigned iter = 1;; ++iter) {
    bool moved = progress();
    if (done()) return;
    if (moved || (iter & 15) != 0) continue;
    if (aborted()) sdk::fail(DT_ERR_ABORTED, std::string("ucx: ") + what + " aborted");
    auto now = Clock::now();
    if (start == Clock::time_point{}) start = now;
    if (now >= deadline) fail_timeout(waiting_for ? waiting_for() : -1, what);
    auto spent = now - start;
    if (spent < spin_) continue;
    // No sched_yield phase: on a loaded host it hands the core to another
    // process for a whole time slice (measured: 16 KiB all-reduce 9 -> 415 us).
    block(deadline);
  }
}

void Fabric::wait_all(Request* reqs, size_t n, Clock::time_point deadline, const char* what) {
  size_t first = 0;
  auto all_done = [&] {
    while (first < n && poll(reqs[first])) ++first;
    for (size_t i = first; i < n; ++i)
      if (!poll(reqs[i])) return false;
    return true;
  };
  progress_until(all_done, deadline, what, [&] {
    for (size_t i = 0; i < n; ++i)
      if (!reqs[i].done()) return reqs[i].peer;
    return -1;
  });
  for (size_t i = 0; i < n; ++i) check(reqs[i], what);
}

// --------------------------------------------------------------- P2pWork ----

P2pWork::P2pWork(std::shared_ptr<Fabric> fabric, Request r, Clock::time_point deadline)
    : fabric_(std::move(fabric)), req_(r), deadline_(deadline) {
  settle_locked();
}

P2pWork::~P2pWork() {
  std::lock_guard<std::mutex> lk(req_mu_);
  fabric_->discard(req_);
}

void P2pWork::settle_locked() {
  if (!fabric_->poll(req_)) return;
  try {
    fabric_->check(req_, req_.is_send ? "send" : "recv");
    complete(DT_OK);
  } catch (const sdk::Error& e) {
    complete(e.status(), e.what());
  }
}

bool P2pWork::poke() {
  std::unique_lock<std::mutex> lk(req_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  if (!req_.done()) settle_locked();
  return req_.done();
}

dt_status_t P2pWork::test() {
  if (Work::test() == DT_IN_PROGRESS) {
    fabric_->progress();
    poke();
  }
  return Work::test();
}

dt_status_t P2pWork::wait(int64_t timeout_ms) {
  if (Work::test() != DT_IN_PROGRESS) return Work::test();
  auto cap = timeout_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(timeout_ms);
  const char* what = req_.is_send ? "send" : "recv";
  try {
    fabric_->progress_until(
        [&] {
          if (Work::test() != DT_IN_PROGRESS) return true;
          poke();
          return Work::test() != DT_IN_PROGRESS;
        },
        std::min(deadline_, cap), what, [&] { return req_.peer; });
  } catch (const sdk::Error& e) {
    std::lock_guard<std::mutex> lk(req_mu_);
    fabric_->discard(req_);
    complete(e.status(), e.what());
  }
  return Work::test();
}

void P2pWork::fail_aborted(const std::string& reason) {
  std::lock_guard<std::mutex> lk(req_mu_);
  fabric_->discard(req_);
  complete(DT_ERR_ABORTED, reason);
}

// ---------------------------------------------------------------- Engine ----

struct UcxCommunicator::Engine {
  std::shared_ptr<Fabric> fabric;
  Settings s;
  std::vector<char> chunks;  // ring pipeline slots
  std::vector<char> full;    // whole-buffer scratch
  std::vector<char> small;   // recursive doubling partner data

  uint64_t produced = 0;  // chunks written to our mailbox, ever
  uint64_t consumed = 0;  // chunks read from the previous rank's mailbox, ever

  Fabric& f() { return *fabric; }
  bool shm_ok(size_t bytes) const { return s.shm && fabric->mailbox_prev() && bytes > s.small_bytes; }

  static std::atomic<uint64_t>& counter(char* box, size_t off) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(box + off);
  }

  // One ring step over the mailboxes: streams [sptr, sptr + sbytes) to the
  // next rank in chunks while handing each chunk of the previous rank's
  // stream (rbytes in all) to take(k, data, bytes) as soon as it is there.
  template <typename Take>
  void shm_step(const char* sptr, size_t sbytes, size_t rbytes, size_t chunk_bytes, Take&& take,
                Clock::time_point deadline, const char* what) {
    char* mine = fabric->mailbox_mine();
    char* prev = fabric->mailbox_prev();
    size_t depth = static_cast<size_t>(s.depth);
    size_t slot = s.chunk_bytes;
    auto& my_head = counter(mine, MailboxLayout::kHead);
    auto& my_tail = counter(mine, MailboxLayout::kTail);
    auto& prev_head = counter(prev, MailboxLayout::kHead);
    auto& prev_tail = counter(prev, MailboxLayout::kTail);
    size_t nsend = (sbytes + chunk_bytes - 1) / chunk_bytes, nrecv = (rbytes + chunk_bytes - 1) / chunk_bytes;
    size_t i = 0, j = 0;
    auto start = Clock::now();
    unsigned idle = 0;
    while (i < nsend || j < nrecv) {
      bool moved = false;
      if (i < nsend && produced - my_tail.load(std::memory_order_acquire) < depth) {
        size_t len = std::min(chunk_bytes, sbytes - i * chunk_bytes);
        std::memcpy(mine + MailboxLayout::kRing + (produced % depth) * slot, sptr + i * chunk_bytes, len);
        my_head.store(++produced, std::memory_order_release);
        ++i;
        moved = true;
      }
      if (j < nrecv && prev_head.load(std::memory_order_acquire) > consumed) {
        size_t len = std::min(chunk_bytes, rbytes - j * chunk_bytes);
        take(j, prev + MailboxLayout::kRing + (consumed % depth) * slot, len);
        prev_tail.store(++consumed, std::memory_order_release);
        ++j;
        moved = true;
      }
      if (moved) {
        idle = 0;
        start = Clock::now();
      } else if ((++idle & 63) == 0) {
        fabric->backoff(start, deadline, j < nrecv ? mod(me() - 1) : mod(me() + 1), what);
      }
    }
  }
  int n() const { return fabric->size(); }
  int me() const { return fabric->rank(); }
  static char* grow(std::vector<char>& v, size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
  }

  // Block b of `count` elements split over n ranks: offset and length in elements.
  size_t block_off(size_t count, int b) const {
    size_t base = count / n(), rem = count % n();
    return b * base + std::min<size_t>(b, rem);
  }
  size_t block_len(size_t count, int b) const {
    size_t base = count / n(), rem = count % n();
    return base + (static_cast<size_t>(b) < rem ? 1 : 0);
  }
  int mod(int x) const { return ((x % n()) + n()) % n(); }

  bool use_ring(size_t count, size_t esz) const {
    if (count < static_cast<size_t>(n())) return false;
    if (s.algorithm == Algorithm::Ring) return true;
    if (s.algorithm == Algorithm::RecursiveDoubling) return false;
    return count * esz > s.small_bytes;
  }

  void allreduce(const void* src, void* dst, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                 Clock::time_point deadline) {
    size_t esz = sdk::dtype_size(dtype);
    if (count == 0) return;
    if (n() == 1 || !use_ring(count, esz)) {
      if (src != dst) std::memcpy(dst, src, count * esz);
      if (n() > 1) small_allreduce(dst, count, dtype, op, seq, deadline);
    } else {
      ring_reduce_scatter(src, dst, nullptr, count, dtype, op, seq, deadline);
      ring_allgather(dst, count, esz, seq, deadline);
    }
    if (op == DT_OP_AVG) sdk::scale_avg(dtype, dst, count, n());
  }

  // In-place all-reduce of a small buffer: flat through the mailboxes when
  // every rank is on this host, else recursive doubling over tag messages.
  void small_allreduce(void* buf, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                       Clock::time_point deadline) {
    size_t bytes = count * sdk::dtype_size(dtype);
    if (s.shm && fabric->mailbox_mine() && n() <= MailboxLayout::kMaxFlatRanks && bytes <= s.small_bytes)
      flat_allreduce(buf, count, dtype, op, deadline);
    else
      recursive_doubling(buf, count, dtype, op, seq, deadline);
  }

  // Every rank publishes its data in its mailbox, then reduces all ranks'
  // data in rank order (the same result everywhere) and acknowledges.
  uint64_t small_ops = 0;
  void flat_allreduce(void* buf, size_t count, int32_t dtype, int32_t op, Clock::time_point deadline) {
    size_t bytes = count * sdk::dtype_size(dtype);
    ReduceFn fn = reduce_fn(dtype, op);
    uint64_t k = small_ops++;
    size_t at_k = MailboxLayout::small_at(s.chunk_bytes, s.depth, s.small_bytes, static_cast<int>(k % 2));
    char* mine = fabric->mailbox_mine();
    Clock::time_point start{};
    auto wait_for = [&](std::atomic<uint64_t>& c, uint64_t v, int peer) {
      for (unsigned i = 1; c.load(std::memory_order_acquire) < v; ++i) {
        if ((i & 63) != 0) continue;
        if (start == Clock::time_point{}) start = Clock::now();
        fabric->backoff(start, deadline, peer, "allreduce");
      }
    };
    // Buffer k % 2 was last used by op k - 2: every reader must be done with it.
    if (k >= 2)
      for (int p = 0; p < n(); ++p)
        if (p != me()) wait_for(counter(mine, MailboxLayout::kAck + 64 * p), k - 1, p);
    std::memcpy(mine + at_k, buf, bytes);
    counter(mine, MailboxLayout::kSeq).store(k + 1, std::memory_order_release);
    for (int p = 0; p < n(); ++p)
      if (p != me()) wait_for(counter(fabric->mailbox_of(p), MailboxLayout::kSeq), k + 1, p);
    if (n() == 2) {
      // buf still holds this rank's data: reduce it with the peer's in rank order.
      const char* peer = fabric->mailbox_of(1 - me()) + at_k;
      fn(buf, me() == 0 ? buf : peer, me() == 0 ? peer : buf, count);
    } else {
      fn(buf, fabric->mailbox_of(0) + at_k, fabric->mailbox_of(1) + at_k, count);
      for (int p = 2; p < n(); ++p) fn(buf, buf, fabric->mailbox_of(p) + at_k, count);
    }
    for (int p = 0; p < n(); ++p)
      if (p != me()) counter(fabric->mailbox_of(p), MailboxLayout::kAck + 64 * me()).store(k + 1, std::memory_order_release);
  }

  void recursive_doubling(void* buf, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                          Clock::time_point deadline) {
    size_t bytes = count * sdk::dtype_size(dtype);
    ReduceFn fn = reduce_fn(dtype, op);
    char* tmp = grow(small, bytes);
    int p2 = 1;
    while (p2 * 2 <= n()) p2 *= 2;
    int extra = n() - p2, r = me();
    uint64_t my_tag = Fabric::coll_tag(r, seq);
    if (r >= p2) {
      Batch b(f());
      b.add(f().isend(r - p2, my_tag, buf, bytes));
      b.add(f().irecv(r - p2, Fabric::coll_tag(r - p2, seq), buf, bytes));
      b.wait(deadline, "allreduce");
      return;
    }
    if (r < extra) {
      Batch b(f());
      b.add(f().irecv(r + p2, Fabric::coll_tag(r + p2, seq), tmp, bytes));
      b.wait(deadline, "allreduce");
      fn(buf, buf, tmp, count);
    }
    for (int mask = 1; mask < p2; mask <<= 1) {
      int partner = r ^ mask;
      Batch b(f());
      b.add(f().irecv(partner, Fabric::coll_tag(partner, seq), tmp, bytes));
      b.add(f().isend(partner, my_tag, buf, bytes));
      b.wait(deadline, "allreduce");
      fn(buf, buf, tmp, count);
    }
    if (r < extra) {
      Batch b(f());
      b.add(f().isend(r + p2, my_tag, buf, bytes));
      b.wait(deadline, "allreduce");
    }
  }

  // Ring reduce-scatter over blocks of `count`: afterwards dst holds this
  // rank's fully reduced block (block me()), written to final_dst instead
  // when given. src is this rank's input (may equal dst); other blocks of
  // dst are used as accumulators. Each step's block moves in chunks, and
  // every chunk is reduced as soon as it lands, while later ones are in flight.
  void ring_reduce_scatter(const void* src, void* dst, void* final_dst, size_t count, int32_t dtype, int32_t op,
                           uint64_t seq, Clock::time_point deadline) {
    size_t esz = sdk::dtype_size(dtype);
    ReduceFn fn = reduce_fn(dtype, op);
    int r = me(), next = mod(r + 1), prev = mod(r - 1);
    size_t chunk = std::max<size_t>(1, s.chunk_bytes / esz);
    int depth = std::max(1, s.depth);
    char* slots = grow(chunks, chunk * esz * depth);
    for (int step = 0; step < n() - 1; ++step) {
      int sb = mod(r - 1 - step), rb = mod(r - 2 - step);
      const char* sptr = at(step == 0 ? src : dst, block_off(count, sb) * esz);
      size_t slen = block_len(count, sb);
      size_t roff = block_off(count, rb), rlen = block_len(count, rb);
      char* out = (step == n() - 2 && final_dst) ? static_cast<char*>(final_dst) : at(dst, roff * esz);
      const char* mine = at(src, roff * esz);
      if (shm_ok(count * esz)) {
        shm_step(sptr, slen * esz, rlen * esz, chunk * esz,
                 [&](size_t k, const char* data, size_t bytes) {
                   fn(out + k * chunk * esz, mine + k * chunk * esz, data, bytes / esz);
                 },
                 deadline, "ring reduce-scatter");
        continue;
      }
      Batch sends(f());
      for (size_t o = 0; o < slen; o += chunk)
        sends.add(f().isend(next, Fabric::coll_tag(r, seq), sptr + o * esz, std::min(chunk, slen - o) * esz));
      size_t nchunks = (rlen + chunk - 1) / chunk;
      Batch recvs(f());
      recvs.reqs.reserve(depth);
      auto post = [&](size_t k) {
        size_t len = std::min(chunk, rlen - k * chunk);
        return f().irecv(prev, Fabric::coll_tag(prev, seq), slots + (k % depth) * chunk * esz, len * esz);
      };
      for (size_t k = 0; k < nchunks && k < static_cast<size_t>(depth); ++k) recvs.add(post(k));
      for (size_t k = 0; k < nchunks; ++k) {
        Request& slot = recvs.reqs[k % depth];
        f().wait(slot, deadline, "ring reduce-scatter");
        size_t len = std::min(chunk, rlen - k * chunk);
        fn(out + k * chunk * esz, mine + k * chunk * esz, slots + (k % depth) * chunk * esz, len);
        if (k + depth < nchunks) slot = post(k + depth);
      }
      sends.wait(deadline, "ring reduce-scatter");
    }
  }

  // Ring all-gather of the blocks of `count` in place in buf, starting from
  // this rank's block.
  void ring_allgather(void* buf, size_t count, size_t esz, uint64_t seq, Clock::time_point deadline) {
    int r = me(), next = mod(r + 1), prev = mod(r - 1);
    size_t chunk = std::max<size_t>(esz, s.chunk_bytes / esz * esz);
    for (int step = 0; step < n() - 1; ++step) {
      int sb = mod(r - step), rb = mod(r - step - 1);
      if (shm_ok(count * esz)) {
        char* dst = at(buf, block_off(count, rb) * esz);
        shm_step(at(buf, block_off(count, sb) * esz), block_len(count, sb) * esz, block_len(count, rb) * esz, chunk,
                 [&](size_t k, const char* data, size_t bytes) { std::memcpy(dst + k * chunk, data, bytes); },
                 deadline, "ring all-gather");
        continue;
      }
      Batch b(f());
      b.add(f().irecv(prev, Fabric::coll_tag(prev, seq), at(buf, block_off(count, rb) * esz),
                      block_len(count, rb) * esz));
      b.add(f().isend(next, Fabric::coll_tag(r, seq), at(buf, block_off(count, sb) * esz),
                      block_len(count, sb) * esz));
      b.wait(deadline, "ring all-gather");
    }
  }

  void broadcast(void* buf, size_t bytes, int root, uint64_t seq, Clock::time_point deadline) {
    int vr = mod(me() - root);
    int mask = 1;
    while (mask < n()) {
      if (vr & mask) {
        int src = mod(vr - mask + root);
        Batch b(f());
        b.add(f().irecv(src, Fabric::coll_tag(src, seq), buf, bytes));
        b.wait(deadline, "broadcast");
        break;
      }
      mask <<= 1;
    }
    Batch b(f());
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (vr + mask < n()) b.add(f().isend(mod(vr + mask + root), Fabric::coll_tag(me(), seq), buf, bytes));
    b.wait(deadline, "broadcast");
  }

  void allgather(const void* send, void* recv, size_t bytes, uint64_t seq, Clock::time_point deadline) {
    char* mine = at(recv, me() * bytes);
    if (send != mine) std::memmove(mine, send, bytes);
    if (n() > 1) ring_allgather(recv, bytes * n(), 1, seq, deadline);
  }

  void reduce_scatter(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, uint64_t seq,
                      Clock::time_point deadline) {
    size_t esz = sdk::dtype_size(dtype), total = count * n();
    if (n() == 1 || !use_ring(total, esz)) {
      char* tmp = grow(full, total * esz);
      std::memcpy(tmp, send, total * esz);
      if (n() > 1) small_allreduce(tmp, total, dtype, op, seq, deadline);
      std::memcpy(recv, tmp + me() * count * esz, count * esz);
    } else {
      char* acc = grow(full, total * esz);
      ring_reduce_scatter(send, acc, recv, total, dtype, op, seq, deadline);
    }
    if (op == DT_OP_AVG) sdk::scale_avg(dtype, recv, count, n());
  }

  void reduce(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, int root, uint64_t seq,
              Clock::time_point deadline) {
    size_t esz = sdk::dtype_size(dtype), bytes = count * esz;
    bool is_root = me() == root;
    if (n() == 1 || !use_ring(count, esz)) {
      char* tmp = grow(full, bytes);
      std::memcpy(tmp, send, bytes);
      if (n() > 1) small_allreduce(tmp, count, dtype, op, seq, deadline);
      if (is_root) std::memcpy(recv, tmp, bytes);
    } else {
      void* acc = is_root ? recv : grow(full, bytes);
      ring_reduce_scatter(send, acc, nullptr, count, dtype, op, seq, deadline);
      Batch b(f());
      if (is_root) {
        for (int p = 0; p < n(); ++p)
          if (p != root)
            b.add(f().irecv(p, Fabric::coll_tag(p, seq), at(recv, block_off(count, p) * esz), block_len(count, p) * esz));
      } else {
        b.add(f().isend(root, Fabric::coll_tag(me(), seq), at(acc, block_off(count, me()) * esz),
                        block_len(count, me()) * esz));
      }
      b.wait(deadline, "reduce");
    }
    if (is_root && op == DT_OP_AVG) sdk::scale_avg(dtype, recv, count, n());
  }

  void alltoall(const void* send, void* recv, size_t bytes, uint64_t seq, Clock::time_point deadline) {
    size_t blk = bytes / n();
    const void* in = send;
    if (send == recv) {
      char* tmp = grow(full, bytes);
      std::memcpy(tmp, send, bytes);
      in = tmp;
    }
    Batch b(f());
    for (int i = 1; i < n(); ++i) {
      int from = mod(me() - i);
      b.add(f().irecv(from, Fabric::coll_tag(from, seq), at(recv, from * blk), blk));
    }
    for (int i = 1; i < n(); ++i) {
      int to = mod(me() + i);
      b.add(f().isend(to, Fabric::coll_tag(me(), seq), at(in, to * blk), blk));
    }
    std::memcpy(at(recv, me() * blk), at(in, me() * blk), blk);
    b.wait(deadline, "alltoall");
  }

  void barrier(uint64_t seq, Clock::time_point deadline) {
    for (int k = 1; k < n(); k <<= 1) {
      int to = mod(me() + k), from = mod(me() - k);
      Batch b(f());
      b.add(f().irecv(from, Fabric::coll_tag(from, seq), nullptr, 0));
      b.add(f().isend(to, Fabric::coll_tag(me(), seq), nullptr, 0));
      b.wait(deadline, "barrier");
    }
  }
};

// ------------------------------------------------------- UcxCommunicator ----

namespace {

// Across hosts: every interface that is up and not loopback, plus every RDMA
// port (a loopback address would reach this host, not the peer's, e.g. between
// network namespaces). "" leaves UCX's own default.
std::string remote_devices() {
  std::set<std::string> names;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next)
      if (i->ifa_addr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6) &&
          (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK))
        names.insert(i->ifa_name);
    freeifaddrs(ifs);
  }
  if (DIR* d = opendir("/sys/class/infiniband")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::string ports = std::string("/sys/class/infiniband/") + e->d_name + "/ports";
      if (DIR* pd = opendir(ports.c_str())) {
        while (dirent* pe = readdir(pd))
          if (pe->d_name[0] != '.') names.insert(std::string(e->d_name) + ":" + pe->d_name);
        closedir(pd);
      }
    }
    closedir(d);
  }
  std::string out;
  for (auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

std::string default_net_devices(const sdk::CommInit& init) {
  if (std::getenv("UCX_NET_DEVICES")) return "";  // the user's environment decides
  return init.local_world_size >= init.world_size ? "lo" : remote_devices();
}

// What makes two ranks "on one host" for shared memory and CMA: the same
// hostname and the same network namespace (namespaces stand in for hosts in
// tests, and UCX must then go over the network as between real hosts).
std::string host_identity() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char ns[128] = {};
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  return std::string(host) + "/" + (n > 0 ? std::string(ns, static_cast<size_t>(n)) : std::string());
}

}  // namespace

UcxCommunicator::UcxCommunicator(const sdk::CommInit& init) : timeout_ms_(init.timeout_ms) {
  Settings s;
  s.algorithm = parse_algorithm(init.options.get_string("algorithm", "auto"));
  s.small_bytes = static_cast<size_t>(init.options.get_int("small_message_bytes", static_cast<int64_t>(s.small_bytes)));
  s.chunk_bytes = static_cast<size_t>(
      std::max<int64_t>(4096, init.options.get_int("chunk_bytes", static_cast<int64_t>(s.chunk_bytes))));
  s.depth = static_cast<int>(std::max<int64_t>(1, init.options.get_int("pipeline_depth", s.depth)));
  s.spin = std::chrono::microseconds(std::max<int64_t>(0, init.options.get_int("spin_us", s.spin.count())));
  std::string tls = init.options.get_string("tls", "");
  std::string devs = init.options.get_string("net_devices", "");
  if (devs.empty()) devs = default_net_devices(init);
  std::string eh = init.options.get_string("error_handling", "auto");
  ErrorHandling errors = eh == "peer" ? ErrorHandling::Peer : eh == "none" ? ErrorHandling::None : ErrorHandling::Auto;
  if (eh != "auto" && eh != "peer" && eh != "none")
    sdk::fail(DT_ERR_INVALID_USAGE, "ucx.error_handling = \"" + eh + "\" is not known; use \"auto\", \"peer\" or \"none\"");
  s.shm = init.options.get_bool("shared_memory", true);
  std::string fingerprint = "algorithm=" + init.options.get_string("algorithm", "auto") +
                            " small_message_bytes=" + std::to_string(s.small_bytes) +
                            " chunk_bytes=" + std::to_string(s.chunk_bytes) + " pipeline_depth=" +
                            std::to_string(s.depth) + " shared_memory=" + (s.shm ? "true" : "false");
  fabric_ = std::make_shared<Fabric>(init, tls, devs, errors, s.spin,
                                     s.shm ? MailboxLayout::bytes(s.chunk_bytes, s.depth, s.small_bytes) : 0,
                                     fingerprint);
  engine_ = std::make_shared<Engine>();
  engine_->fabric = fabric_;
  engine_->s = s;
  OpQueue::Timing t;
  t.grace = std::chrono::microseconds(std::max<int64_t>(0, init.options.get_int("grace_us", 1000)));
  t.poll = std::max(t.grace, std::chrono::microseconds(1000));
  queue_ = std::make_shared<OpQueue>(t, [this] { progress_p2p(); });
  queue_->start();
}

UcxCommunicator::~UcxCommunicator() {
  abort("communicator destroyed");
  queue_->stop();
  queue_->quiesce();
}

void UcxCommunicator::abort(const std::string& reason) {
  if (aborted_.exchange(true)) return;
  fabric_->abort();
  queue_->abort(reason);
  std::vector<std::shared_ptr<P2pWork>> live;
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    for (auto& w : p2p_)
      if (auto p = w.lock()) live.push_back(std::move(p));
    p2p_.clear();
  }
  for (auto& w : live) w->fail_aborted(reason);
}

void UcxCommunicator::progress_p2p() {
  std::vector<std::shared_ptr<P2pWork>> live;
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    for (auto it = p2p_.begin(); it != p2p_.end();) {
      auto p = it->lock();
      if (!p || p->Work::test() != DT_IN_PROGRESS) {
        it = p2p_.erase(it);
      } else {
        live.push_back(std::move(p));
        ++it;
      }
    }
  }
  if (live.empty()) return;
  while (fabric_->progress()) {
  }
  for (auto& w : live) w->poke();
}

Clock::time_point UcxCommunicator::deadline_of(const Opts& o) const {
  return Clock::now() + std::chrono::milliseconds(o.timeout_ms > 0 ? o.timeout_ms : timeout_ms_);
}

template <typename F>
std::shared_ptr<sdk::Work> UcxCommunicator::enqueue(const Opts& o, F&& body) {
  if (aborted_.load()) sdk::fail(DT_ERR_ABORTED, "ucx: communicator aborted");
  uint64_t seq = coll_seq_++;
  auto now = Clock::now();  // precise: the drainer's grace period is measured from it
  return queue_->submit(
      [e = engine_, seq, body = std::forward<F>(body)](Clock::time_point deadline) mutable {
        body(*e, seq, deadline);
      },
      now + std::chrono::milliseconds(o.timeout_ms > 0 ? o.timeout_ms : timeout_ms_), now);
}

std::shared_ptr<sdk::Work> UcxCommunicator::allreduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) {
  check_cpu(send);
  check_cpu(recv);
  reduce_fn(recv.dtype, op);  // refuses unknown codes at submission
  return enqueue(o, [send, recv, op](Engine& e, uint64_t seq, Clock::time_point d) {
    e.allreduce(send.ptr, recv.ptr, recv.count, recv.dtype, op, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::broadcast(const Buf& buf, const Opts& o) {
  check_cpu(buf);
  int root = o.root;
  return enqueue(o, [buf, root](Engine& e, uint64_t seq, Clock::time_point d) {
    size_t bytes = sdk::bytes_of(buf);
    if (bytes && e.n() > 1) e.broadcast(buf.ptr, bytes, root, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::allgather(const Buf& send, const Buf& recv, const Opts& o) {
  check_cpu(send);
  check_cpu(recv);
  return enqueue(o, [send, recv](Engine& e, uint64_t seq, Clock::time_point d) {
    size_t bytes = sdk::bytes_of(send);
    if (bytes) e.allgather(send.ptr, recv.ptr, bytes, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::reduce_scatter(const Buf& send, const Buf& recv, int32_t op,
                                                           const Opts& o) {
  check_cpu(send);
  check_cpu(recv);
  reduce_fn(recv.dtype, op);
  return enqueue(o, [send, recv, op](Engine& e, uint64_t seq, Clock::time_point d) {
    if (recv.count) e.reduce_scatter(send.ptr, recv.ptr, recv.count, recv.dtype, op, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::reduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) {
  check_cpu(send);
  reduce_fn(send.dtype, op);
  int root = o.root;
  return enqueue(o, [send, recv, op, root](Engine& e, uint64_t seq, Clock::time_point d) {
    if (send.count) e.reduce(send.ptr, recv.ptr, send.count, send.dtype, op, root, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::alltoall(const Buf& send, const Buf& recv, const Opts& o) {
  check_cpu(send);
  check_cpu(recv);
  return enqueue(o, [send, recv](Engine& e, uint64_t seq, Clock::time_point d) {
    size_t bytes = sdk::bytes_of(send);
    if (bytes) e.alltoall(send.ptr, recv.ptr, bytes, seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::barrier(const Opts& o) {
  return enqueue(o, [](Engine& e, uint64_t seq, Clock::time_point d) {
    if (e.n() > 1) e.barrier(seq, d);
  });
}

std::shared_ptr<sdk::Work> UcxCommunicator::post(const Buf& buf, int32_t peer, const Opts& o, bool is_send) {
  check_cpu(buf);
  if (aborted_.load()) sdk::fail(DT_ERR_ABORTED, "ucx: communicator aborted");
  if (peer < 0 || peer >= fabric_->size() || peer == fabric_->rank())
    sdk::fail(DT_ERR_INVALID_USAGE, "ucx: invalid peer rank " + std::to_string(peer));
  size_t bytes = sdk::bytes_of(buf);
  Request r = is_send ? fabric_->isend(peer, Fabric::p2p_tag(fabric_->rank(), o.tag), buf.ptr, bytes)
                      : fabric_->irecv(peer, Fabric::p2p_tag(peer, o.tag), buf.ptr, bytes);
  auto w = std::make_shared<P2pWork>(fabric_, r, deadline_of(o));
  if (w->Work::test() == DT_IN_PROGRESS) {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    p2p_.push_back(w);
  }
  return w;
}

std::shared_ptr<sdk::Work> UcxCommunicator::send(const Buf& buf, int32_t peer, const Opts& o) {
  return post(buf, peer, o, true);
}

std::shared_ptr<sdk::Work> UcxCommunicator::recv(const Buf& buf, int32_t peer, const Opts& o) {
  return post(buf, peer, o, false);
}

}  // namespace dtrain::ucx_backend
