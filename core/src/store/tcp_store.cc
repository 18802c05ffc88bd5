// TCP store: one server thread multiplexing every client with poll(), and a
// blocking client with one connection per TcpStore object.
//
// Wire format: every message is a frame "u32 length (little-endian) + payload".
// A request payload starts with a u8 opcode, a response payload with a u8 status.
// Strings and byte strings are "u32 length + bytes", integers little-endian.
//   HELLO   u32 magic, u32 version, str token   -> OK | REFUSED str reason
//   SET     str key, bytes value                -> OK
//   GET     str key, i64 timeout_ms             -> OK bytes | TIMEOUT u32 n, n*str
//   TRY_GET str key                             -> OK bytes | NOT_FOUND
//   ADD     str key, i64 delta                  -> OK i64 | ERROR str
//   CAS     str key, bytes expected, bytes new  -> OK bytes
//   CHECK   u32 n, n*str                        -> OK u8
//   WAIT    u32 n, n*str, i64 timeout_ms        -> OK | TIMEOUT u32 n, n*str
//   REMOVE  str key                             -> OK u8
// GET and WAIT block on the server: the connection gets no answer until the keys
// exist or the deadline passes (the server then answers TIMEOUT).

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/store_util.h"

namespace dtrain {
namespace {

using store_detail::Clock;
using std::chrono::milliseconds;

enum class Op : uint8_t { Hello = 1, Set, Get, TryGet, Add, CompareSet, Check, Wait, Remove };
enum class Status : uint8_t { Ok = 0, NotFound = 1, Timeout = 2, Error = 3, Refused = 4 };

constexpr uint32_t kMagic = 0x31535444;  // "DTS1"
constexpr uint32_t kVersion = 1;
constexpr size_t kMaxMessage = size_t(1) << 30;
constexpr size_t kMaxHelloMessage = 4096;
constexpr auto kHelloTimeout = std::chrono::seconds(30);
constexpr auto kConnectRetry = milliseconds(50);
// How much longer than the server-side timeout a client waits for an answer before
// it declares the server dead.
constexpr auto kClientSlack = std::chrono::seconds(3);
const char* const kTokenHint = " (the job's token is passed in DTRAIN_JOB_TOKEN)";

struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string errno_text(int err) { return std::strerror(err); }

std::string format_address(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string sockaddr_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    return format_address(buf, ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    return format_address(buf, ntohs(in6->sin6_port));
  }
  return "unknown address";
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

class Writer {
 public:
  Writer() { buf_.resize(4); }
  Writer& u8(uint8_t v) {
    buf_.push_back(v);
    return *this;
  }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Writer& i64(int64_t v) {
    auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(u >> (8 * i)));
    return *this;
  }
  Writer& raw(const void* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
    return *this;
  }
  Writer& str(const std::string& s) { return raw(s.data(), s.size()); }
  Writer& bytes(const Bytes& b) { return raw(b.data(), b.size()); }
  Writer& strs(const std::vector<std::string>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (const auto& s : v) str(s);
    return *this;
  }
  // Fills in the length prefix and hands out the frame.
  std::vector<uint8_t> frame() {
    size_t n = buf_.size() - 4;
    if (n > kMaxMessage) throw InvalidUsage("store message of " + std::to_string(n) + " bytes exceeds the 1 GiB limit");
    for (int i = 0; i < 4; ++i) buf_[i] = static_cast<uint8_t>(n >> (8 * i));
    return std::move(buf_);
  }

 private:
  std::vector<uint8_t> buf_;
};

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8() {
    need(1);
    return p_[off_++];
  }
  uint32_t u32() {
    need(4);
    uint32_t v = load_u32(p_ + off_);
    off_ += 4;
    return v;
  }
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(p_[off_ + i]) << (8 * i);
    off_ += 8;
    return static_cast<int64_t>(v);
  }
  std::string str() {
    uint32_t n = u32();
    need(n);
    std::string s(reinterpret_cast<const char*>(p_ + off_), n);
    off_ += n;
    return s;
  }
  Bytes bytes() {
    uint32_t n = u32();
    need(n);
    Bytes b(p_ + off_, p_ + off_ + n);
    off_ += n;
    return b;
  }
  std::vector<std::string> strs() {
    uint32_t n = u32();
    if (n > n_ - off_) throw ProtocolError("key count exceeds the message");
    std::vector<std::string> v;
    v.reserve(n);
    for (uint32_t i = 0; i < n; ++i) v.push_back(str());
    return v;
  }
  void end() const {
    if (off_ != n_) throw ProtocolError("trailing bytes in message");
  }

 private:
  void need(size_t k) const {
    if (k > n_ - off_) throw ProtocolError("truncated message");
  }
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
};

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

int poll_timeout_ms(Clock::time_point deadline) {
  auto now = Clock::now();
  if (deadline <= now) return 0;
  auto ms = std::chrono::duration_cast<milliseconds>(deadline - now).count() + 1;  // round up
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

}  // namespace

// ---------------------------------------------------------------------------
// Server

struct TcpStoreServer::Impl {
  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    std::string peer;
    bool authed = false;
    bool closing = false;  // flush the output, then close
    bool dead = false;
    std::vector<uint8_t> in;
    size_t in_off = 0;
    std::vector<uint8_t> out;
    size_t out_off = 0;
    Clock::time_point hello_deadline;
    // A GET or WAIT the server holds until its keys exist.
    bool waiting = false;
    Op wait_op = Op::Wait;
    std::vector<std::string> wait_keys;  // still missing
    std::string get_key;
    Clock::time_point deadline;
  };

  std::string host;
  uint16_t port = 0;
  std::string token;
  std::string address;
  int listen_fd = -1;
  int wake_fd = -1;
  std::atomic<int> refused{0};
  std::thread thread;

  // Owned by the server thread.
  std::map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_id = 1;
  std::unordered_map<std::string, Bytes> data;
  std::unordered_map<std::string, std::unordered_set<uint64_t>> waiters;
  std::vector<uint64_t> runnable;
  bool accept_failing = false;

  void bind_and_listen();
  void run();
  void accept_all();
  void read_from(Conn& c);
  void process_frames(Conn& c);
  void handle(Conn& c, Reader& r);
  void handle_hello(Conn& c, Reader& r);
  void reply(Conn& c, std::vector<uint8_t> frame);
  void flush(Conn& c);
  void refuse(Conn& c, const std::string& reason);
  void start_wait(Conn& c, Op op, std::vector<std::string> missing, int64_t timeout_ms);
  void key_created(const std::string& key);
  void finish_wait(Conn& c, bool timed_out);
  void expire(Clock::time_point now);
  void drain_runnable();
  void reap();
  void drop_waiter(Conn& c);
};

void TcpStoreServer::Impl::bind_and_listen() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0)
    throw IoError("TCP store: cannot resolve the address to serve on '" + address + "': " + ::gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last_error = errno_text(errno);
      continue;
    }
    int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listen_fd = fd;
      break;
    }
    last_error = errno_text(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd < 0)
    throw IoError("TCP store: cannot serve on " + address + ": " + last_error +
                  (last_error == errno_text(EADDRINUSE) ? " (another process holds this port; pick another)" : ""));
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  }
  address = format_address(host, port);
}

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> pfds;
  std::vector<Conn*> polled;
  for (;;) {
    pfds.clear();
    polled.clear();
    pfds.push_back({wake_fd, POLLIN, 0});
    pfds.push_back({listen_fd, POLLIN, 0});
    auto next = Clock::time_point::max();
    for (auto& [id, c] : conns) {
      short ev = c->closing ? 0 : POLLIN;
      if (c->out_off < c->out.size()) ev |= POLLOUT;
      pfds.push_back({c->fd, ev, 0});
      polled.push_back(c.get());
      if (c->waiting) next = std::min(next, c->deadline);
      if (!c->authed && !c->closing) next = std::min(next, c->hello_deadline);
    }
    int timeout = next == Clock::time_point::max() ? -1 : poll_timeout_ms(next);
    int rc = ::poll(pfds.data(), pfds.size(), timeout);
    if (rc < 0 && errno != EINTR) {
      detail::logger().error("TCP store {}: poll failed: {}", address, errno_text(errno));
      std::this_thread::sleep_for(milliseconds(10));
      continue;
    }
    if (rc > 0 && pfds[0].revents) return;
    try {
      if (rc > 0 && (pfds[1].revents & POLLIN)) accept_all();
      for (size_t i = 0; rc > 0 && i < polled.size(); ++i) {
        Conn& c = *polled[i];
        short re = pfds[i + 2].revents;
        if (c.dead || !re) continue;
        if (re & POLLOUT) flush(c);
        if (c.dead) continue;
        if (c.closing) {
          if (re & (POLLHUP | POLLERR)) c.dead = true;
        } else if (re & (POLLIN | POLLHUP | POLLERR)) {
          read_from(c);
        }
      }
      expire(Clock::now());
      drain_runnable();
    } catch (const std::exception& e) {
      detail::logger().error("TCP store {}: internal error: {}", address, e.what());
    }
    reap();
  }
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors: the listener stays readable, so back off instead of spinning.
        if (!accept_failing) detail::logger().warn("TCP store {}: accept failed: {}", address, errno_text(errno));
        accept_failing = true;
        std::this_thread::sleep_for(milliseconds(10));
      }
      return;
    }
    accept_failing = false;
    set_nodelay(fd);
    auto c = std::make_unique<Conn>();
    c->id = next_id++;
    c->fd = fd;
    c->peer = sockaddr_text(reinterpret_cast<sockaddr*>(&ss));
    c->hello_deadline = Clock::now() + kHelloTimeout;
    conns.emplace(c->id, std::move(c));
  }
}

void TcpStoreServer::Impl::read_from(Conn& c) {
  // One recv per poll event keeps a fast sender from starving the others.
  size_t old = c.in.size();
  size_t want = 65536;
  if (old - c.in_off >= 4) {
    size_t frame = 4 + size_t(load_u32(c.in.data() + c.in_off));
    if (frame <= kMaxMessage + 4 && frame > old - c.in_off) want = std::max(want, frame - (old - c.in_off));
  }
  c.in.resize(old + want);
  ssize_t n;
  while ((n = ::recv(c.fd, c.in.data() + old, want, 0)) < 0 && errno == EINTR) {
  }
  c.in.resize(old + std::max<ssize_t>(n, 0));
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
  process_frames(c);
  if (n > 0) return;
  // End of stream or a socket error: drop the client.
  if (!c.authed && !c.closing && !c.dead) {
    refused++;
    detail::logger().warn("TCP store {}: refused client {}: missing job token (it closed the connection first)",
                          address, c.peer);
  }
  c.dead = true;
}

void TcpStoreServer::Impl::process_frames(Conn& c) {
  while (!c.dead && !c.closing && !c.waiting) {
    size_t avail = c.in.size() - c.in_off;
    if (avail < 4) break;
    size_t len = load_u32(c.in.data() + c.in_off);
    if (len > (c.authed ? kMaxMessage : kMaxHelloMessage) || len == 0) {
      if (!c.authed) {
        refuse(c, "missing job token");
      } else {
        std::string why =
            len == 0 ? "empty message" : "message of " + std::to_string(len) + " bytes is too large (limit 1 GiB)";
        detail::logger().warn("TCP store {}: client {} sent a bad frame ({}); closing it", address, c.peer, why);
        reply(c, Writer().u8(uint8_t(Status::Error)).str(why).frame());
        c.closing = true;
        flush(c);
      }
      break;
    }
    if (avail < 4 + len) break;
    Reader r(c.in.data() + c.in_off + 4, len);
    c.in_off += 4 + len;
    try {
      handle(c, r);
    } catch (const ProtocolError& e) {
      if (!c.authed) {
        refuse(c, "missing job token");
      } else {
        detail::logger().warn("TCP store {}: malformed request from {}: {}; closing it", address, c.peer, e.what());
        reply(c, Writer().u8(uint8_t(Status::Error)).str(std::string("malformed request: ") + e.what()).frame());
        c.closing = true;
        flush(c);
      }
    }
  }
  if (c.in_off == c.in.size()) {
    c.in.clear();
    c.in_off = 0;
  } else if (c.in_off > 65536) {
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(c.in_off));
    c.in_off = 0;
  }
}

void TcpStoreServer::Impl::handle_hello(Conn& c, Reader& r) {
  if (static_cast<Op>(r.u8()) != Op::Hello) return refuse(c, "missing job token");
  if (r.u32() != kMagic) return refuse(c, "missing job token");
  uint32_t version = r.u32();
  std::string presented = r.str();
  r.end();
  if (version != kVersion)
    return refuse(c, "store protocol version " + std::to_string(version) + " is not the server's " +
                         std::to_string(kVersion) + " (mixed dtrain versions?)");
  if (presented.empty() && !token.empty()) return refuse(c, "missing job token");
  if (!constant_time_equal(presented, token)) return refuse(c, "wrong job token");
  c.authed = true;
  reply(c, Writer().u8(uint8_t(Status::Ok)).frame());
}

void TcpStoreServer::Impl::handle(Conn& c, Reader& r) {
  if (!c.authed) return handle_hello(c, r);
  auto op = static_cast<Op>(r.u8());
  switch (op) {
    case Op::Set: {
      std::string key = r.str();
      Bytes value = r.bytes();
      r.end();
      data[key] = std::move(value);
      reply(c, Writer().u8(uint8_t(Status::Ok)).frame());
      key_created(key);
      return;
    }
    case Op::Get: {
      std::string key = r.str();
      int64_t timeout = r.i64();
      r.end();
      auto it = data.find(key);
      if (it != data.end()) return reply(c, Writer().u8(uint8_t(Status::Ok)).bytes(it->second).frame());
      c.get_key = key;
      return start_wait(c, Op::Get, {key}, timeout);
    }
    case Op::TryGet: {
      std::string key = r.str();
      r.end();
      auto it = data.find(key);
      if (it == data.end()) return reply(c, Writer().u8(uint8_t(Status::NotFound)).frame());
      return reply(c, Writer().u8(uint8_t(Status::Ok)).bytes(it->second).frame());
    }
    case Op::Add: {
      std::string key = r.str();
      int64_t delta = r.i64();
      r.end();
      int64_t value;
      try {
        auto it = data.find(key);
        value = store_detail::checked_add(key, it == data.end() ? 0 : store_detail::parse_counter(key, it->second),
                                          delta);
      } catch (const Error& e) {
        return reply(c, Writer().u8(uint8_t(Status::Error)).str(e.what()).frame());
      }
      data[key] = store_detail::format_counter(value);
      reply(c, Writer().u8(uint8_t(Status::Ok)).i64(value).frame());
      key_created(key);
      return;
    }
    case Op::CompareSet: {
      std::string key = r.str();
      Bytes expected = r.bytes();
      Bytes desired = r.bytes();
      r.end();
      auto it = data.find(key);
      if (it == data.end() ? expected.empty() : it->second == expected) {
        reply(c, Writer().u8(uint8_t(Status::Ok)).bytes(desired).frame());
        data[key] = std::move(desired);
        key_created(key);
        return;
      }
      return reply(c, Writer().u8(uint8_t(Status::Ok)).bytes(it == data.end() ? Bytes{} : it->second).frame());
    }
    case Op::Check: {
      auto keys = r.strs();
      r.end();
      bool all = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
      return reply(c, Writer().u8(uint8_t(Status::Ok)).u8(all ? 1 : 0).frame());
    }
    case Op::Wait: {
      auto keys = r.strs();
      int64_t timeout = r.i64();
      r.end();
      std::vector<std::string> missing;
      for (auto& k : keys)
        if (!data.count(k)) missing.push_back(std::move(k));
      if (missing.empty()) return reply(c, Writer().u8(uint8_t(Status::Ok)).frame());
      return start_wait(c, Op::Wait, std::move(missing), timeout);
    }
    case Op::Remove: {
      std::string key = r.str();
      r.end();
      bool existed = data.erase(key) > 0;
      return reply(c, Writer().u8(uint8_t(Status::Ok)).u8(existed ? 1 : 0).frame());
    }
    default:
      throw ProtocolError("unknown operation " + std::to_string(int(op)));
  }
}

void TcpStoreServer::Impl::start_wait(Conn& c, Op op, std::vector<std::string> missing, int64_t timeout_ms) {
  c.waiting = true;
  c.wait_op = op;
  c.wait_keys = std::move(missing);
  c.deadline = store_detail::deadline_after(milliseconds(timeout_ms));
  for (const auto& k : c.wait_keys) waiters[k].insert(c.id);
  if (timeout_ms <= 0) finish_wait(c, true);
}

void TcpStoreServer::Impl::key_created(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  auto ids = std::move(it->second);
  waiters.erase(it);
  for (uint64_t id : ids) {
    auto ci = conns.find(id);
    if (ci == conns.end()) continue;
    Conn& c = *ci->second;
    if (c.dead || !c.waiting) continue;
    auto& keys = c.wait_keys;
    keys.erase(std::remove_if(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; }),
               keys.end());
    if (keys.empty()) finish_wait(c, false);
  }
}

void TcpStoreServer::Impl::drop_waiter(Conn& c) {
  for (const auto& k : c.wait_keys) {
    auto it = waiters.find(k);
    if (it == waiters.end()) continue;
    it->second.erase(c.id);
    if (it->second.empty()) waiters.erase(it);
  }
}

void TcpStoreServer::Impl::finish_wait(Conn& c, bool timed_out) {
  drop_waiter(c);
  c.waiting = false;
  if (timed_out) {
    reply(c, Writer().u8(uint8_t(Status::Timeout)).strs(c.wait_keys).frame());
  } else if (c.wait_op == Op::Get) {
    reply(c, Writer().u8(uint8_t(Status::Ok)).bytes(data[c.get_key]).frame());
  } else {
    reply(c, Writer().u8(uint8_t(Status::Ok)).frame());
  }
  c.wait_keys.clear();
  runnable.push_back(c.id);
}

void TcpStoreServer::Impl::expire(Clock::time_point now) {
  for (auto& [id, cp] : conns) {
    Conn& c = *cp;
    if (c.dead) continue;
    if (c.waiting && c.deadline <= now) finish_wait(c, true);
    if (!c.authed && !c.closing && c.hello_deadline <= now)
      refuse(c, "missing job token (none presented within " + std::to_string(kHelloTimeout.count()) + " s)");
  }
}

void TcpStoreServer::Impl::drain_runnable() {
  while (!runnable.empty()) {
    auto ids = std::move(runnable);
    runnable.clear();
    for (uint64_t id : ids) {
      auto it = conns.find(id);
      if (it != conns.end() && !it->second->dead) process_frames(*it->second);
    }
  }
}

void TcpStoreServer::Impl::reap() {
  for (auto it = conns.begin(); it != conns.end();) {
    Conn& c = *it->second;
    if (!c.dead) {
      ++it;
      continue;
    }
    if (c.waiting) drop_waiter(c);
    ::close(c.fd);
    it = conns.erase(it);
  }
}

void TcpStoreServer::Impl::reply(Conn& c, std::vector<uint8_t> frame) {
  if (c.dead) return;
  if (c.out_off == c.out.size()) {
    c.out = std::move(frame);
    c.out_off = 0;
  } else {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
  }
  flush(c);
}

void TcpStoreServer::Impl::flush(Conn& c) {
  while (c.out_off < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.dead = true;
    return;
  }
  c.out.clear();
  c.out_off = 0;
  if (c.closing) {
    ::shutdown(c.fd, SHUT_WR);
    c.dead = true;
  }
}

void TcpStoreServer::Impl::refuse(Conn& c, const std::string& reason) {
  refused++;
  detail::logger().warn("TCP store {}: refused client {}: {}", address, c.peer, reason);
  c.closing = true;
  reply(c, Writer().u8(uint8_t(Status::Refused)).str(reason).frame());
}

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port, std::string token)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->port = port;
  impl_->token = std::move(token);
  impl_->address = format_address(host, port);
  impl_->bind_and_listen();
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl_->wake_fd < 0) {
    int err = errno;
    ::close(impl_->listen_fd);
    throw IoError("TCP store " + impl_->address + ": eventfd failed: " + errno_text(err));
  }
  try {
    impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
  } catch (...) {
    ::close(impl_->listen_fd);
    ::close(impl_->wake_fd);
    throw;
  }
}

TcpStoreServer::~TcpStoreServer() {
  uint64_t one = 1;
  while (::write(impl_->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
  impl_->thread.join();
  for (auto& [id, c] : impl_->conns) ::close(c->fd);
  impl_->conns.clear();
  ::close(impl_->listen_fd);
  ::close(impl_->wake_fd);
}

uint16_t TcpStoreServer::port() const { return impl_->port; }
const std::string& TcpStoreServer::host() const { return impl_->host; }
int TcpStoreServer::refused_clients() const { return impl_->refused.load(); }

// ---------------------------------------------------------------------------
// Client

struct TcpStore::Impl {
  std::string host;
  uint16_t port = 0;
  std::string address;
  int fd = -1;
  std::mutex mu;
  std::string broken;  // why the connection is unusable; empty while healthy
  std::vector<uint8_t> rbuf;
  size_t rpos = 0;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  [[noreturn]] void fail(const std::string& why) {
    broken = why;
    throw IoError("lost the connection to the store at " + address + ": " + why);
  }

  void connect(const std::string& token, milliseconds connect_timeout);
  bool try_connect_once(Clock::time_point deadline, std::string& last_error);
  void send_all(const std::vector<uint8_t>& frame, Clock::time_point deadline);
  std::vector<uint8_t> recv_frame(Clock::time_point deadline, milliseconds waited);
  std::vector<uint8_t> call(const std::vector<uint8_t>& frame, Clock::time_point deadline, milliseconds waited) {
    if (!broken.empty()) throw IoError("the connection to the store at " + address + " was lost earlier: " + broken);
    send_all(frame, deadline);
    return recv_frame(deadline, waited);
  }
  std::vector<uint8_t> call(const std::vector<uint8_t>& frame) {
    return call(frame, Clock::now() + Store::kDefaultTimeout, Store::kDefaultTimeout);
  }
  // Sends a request under the connection mutex and lets f decode the answer.
  template <class F>
  auto exchange(const std::vector<uint8_t>& frame, Clock::time_point deadline, milliseconds waited, F&& f) {
    std::lock_guard<std::mutex> lock(mu);
    auto a = call(frame, deadline, waited);
    Reader r(a.data(), a.size());
    try {
      return f(static_cast<Status>(r.u8()), r);
    } catch (const ProtocolError& e) {
      fail(std::string("malformed answer: ") + e.what());
    }
  }
  template <class F>
  auto exchange(const std::vector<uint8_t>& frame, F&& f) {
    return exchange(frame, Clock::now() + Store::kDefaultTimeout, Store::kDefaultTimeout, std::forward<F>(f));
  }
  [[noreturn]] void throw_status(Status s, Reader& r) {
    if (s == Status::Error) throw InvalidUsage("store at " + address + ": " + r.str());
    fail("unexpected answer status " + std::to_string(int(s)));
  }
};

bool TcpStore::Impl::try_connect_once(Clock::time_point deadline, std::string& last_error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0) {
    last_error = std::string("cannot resolve '") + host + "': " + ::gai_strerror(rc);
    return false;
  }
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int s = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (s < 0) {
      last_error = errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(s, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{s, POLLOUT, 0};
        int prc;
        while ((prc = ::poll(&p, 1, poll_timeout_ms(deadline))) < 0 && errno == EINTR) {
        }
        socklen_t len = sizeof err;
        if (prc == 0) err = ETIMEDOUT;
        else if (::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
    if (err == 0) {
      // Repeated connects to a local port with no listener can connect the socket
      // to itself (TCP simultaneous open); that is no server.
      sockaddr_storage a{}, b{};
      socklen_t la = sizeof a, lb = sizeof b;
      if (::getsockname(s, reinterpret_cast<sockaddr*>(&a), &la) == 0 &&
          ::getpeername(s, reinterpret_cast<sockaddr*>(&b), &lb) == 0 && la == lb && std::memcmp(&a, &b, la) == 0) {
        err = ECONNREFUSED;
      }
    }
    if (err == 0) {
      ::freeaddrinfo(res);
      fd = s;
      set_nodelay(fd);
      return true;
    }
    last_error = errno_text(err);
    ::close(s);
  }
  ::freeaddrinfo(res);
  return false;
}

void TcpStore::Impl::connect(const std::string& token, milliseconds connect_timeout) {
  connect_timeout = store_detail::clamp_timeout(connect_timeout);
  auto deadline = Clock::now() + connect_timeout;
  std::string last_error;
  while (!try_connect_once(deadline, last_error)) {
    auto now = Clock::now();
    if (now >= deadline)
      throw IoError("cannot connect to the store at " + address + " within " +
                    std::to_string(connect_timeout.count()) + " ms: " + last_error +
                    " (is the launcher or rank 0 serving it?)");
    std::this_thread::sleep_for(std::min<Clock::duration>(kConnectRetry, deadline - now));
  }
  auto hello_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(10));
  auto frame = Writer().u8(uint8_t(Op::Hello)).u32(kMagic).u32(kVersion).str(token).frame();
  std::string refusal;
  // exchange() takes the mutex; nobody else can hold this object yet, but it keeps
  // the decoding in one place.
  exchange(frame, hello_deadline, connect_timeout, [&](Status s, Reader& r) {
    if (s == Status::Refused) refusal = r.str();
    else if (s != Status::Ok) throw_status(s, r);
  });
  if (!refusal.empty()) {
    broken = "refused: " + refusal;
    throw InvalidUsage("store at " + address + " refused this process: " + refusal + kTokenHint);
  }
}

void TcpStore::Impl::send_all(const std::vector<uint8_t>& frame, Clock::time_point deadline) {
  size_t off = 0;
  while (off < frame.size()) {
    ssize_t n = ::send(fd, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
      if (rc == 0) fail("the store did not accept the request in time");
      continue;
    }
    fail(errno_text(errno));
  }
}

std::vector<uint8_t> TcpStore::Impl::recv_frame(Clock::time_point deadline, milliseconds waited) {
  auto fill = [&](size_t want) {
    pollfd p{fd, POLLIN, 0};
    for (;;) {
      int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
      if (rc > 0) break;
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) fail(errno_text(errno));
      fail("no answer within " + std::to_string(waited.count()) + " ms (+" +
           std::to_string(std::chrono::duration_cast<milliseconds>(kClientSlack).count()) +
           " ms grace); the server looks dead");
    }
    size_t old = rbuf.size();
    want = std::max<size_t>(want, 65536);
    rbuf.resize(old + want);
    ssize_t n;
    while ((n = ::recv(fd, rbuf.data() + old, want, 0)) < 0 && errno == EINTR) {
    }
    rbuf.resize(old + std::max<ssize_t>(n, 0));
    if (n == 0) fail("the server closed the connection");
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) fail(errno_text(errno));
  };
  while (rbuf.size() - rpos < 4) fill(4);
  size_t len = load_u32(rbuf.data() + rpos);
  if (len > kMaxMessage) fail("answer of " + std::to_string(len) + " bytes exceeds the 1 GiB limit");
  while (rbuf.size() - rpos < 4 + len) fill(4 + len - (rbuf.size() - rpos));
  std::vector<uint8_t> payload(rbuf.begin() + static_cast<std::ptrdiff_t>(rpos + 4),
                               rbuf.begin() + static_cast<std::ptrdiff_t>(rpos + 4 + len));
  rpos += 4 + len;
  if (rpos == rbuf.size()) {
    rbuf.clear();
    rpos = 0;
  }
  if (payload.empty()) fail("empty answer");
  return payload;
}

TcpStore::TcpStore(const std::string& host, uint16_t port, const std::string& token,
                   std::chrono::milliseconds connect_timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->port = port;
  impl_->address = format_address(host, port);
  impl_->connect(token, connect_timeout);
}

TcpStore::~TcpStore() = default;

void TcpStore::set(const std::string& key, const Bytes& value) {
  auto frame = Writer().u8(uint8_t(Op::Set)).str(key).bytes(value).frame();
  impl_->exchange(frame, [&](Status s, Reader& r) {
    if (s != Status::Ok) impl_->throw_status(s, r);
  });
}

Bytes TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  timeout = store_detail::clamp_timeout(timeout);
  auto frame = Writer().u8(uint8_t(Op::Get)).str(key).i64(timeout.count()).frame();
  return impl_->exchange(frame, Clock::now() + timeout + kClientSlack, timeout, [&](Status s, Reader& r) -> Bytes {
    if (s == Status::Ok) return r.bytes();
    if (s == Status::Timeout)
      throw TimeoutError(store_detail::timeout_message({key}, timeout, "the store at " + impl_->address));
    impl_->throw_status(s, r);
  });
}

std::optional<Bytes> TcpStore::try_get(const std::string& key) {
  auto frame = Writer().u8(uint8_t(Op::TryGet)).str(key).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> std::optional<Bytes> {
    if (s == Status::Ok) return r.bytes();
    if (s == Status::NotFound) return std::nullopt;
    impl_->throw_status(s, r);
  });
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto frame = Writer().u8(uint8_t(Op::Add)).str(key).i64(delta).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> int64_t {
    if (s == Status::Ok) return r.i64();
    impl_->throw_status(s, r);
  });
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  auto frame = Writer().u8(uint8_t(Op::CompareSet)).str(key).bytes(expected).bytes(desired).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> Bytes {
    if (s == Status::Ok) return r.bytes();
    impl_->throw_status(s, r);
  });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  auto frame = Writer().u8(uint8_t(Op::Check)).strs(keys).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> bool {
    if (s == Status::Ok) return r.u8() != 0;
    impl_->throw_status(s, r);
  });
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  timeout = store_detail::clamp_timeout(timeout);
  auto frame = Writer().u8(uint8_t(Op::Wait)).strs(keys).i64(timeout.count()).frame();
  impl_->exchange(frame, Clock::now() + timeout + kClientSlack, timeout, [&](Status s, Reader& r) {
    if (s == Status::Ok) return;
    if (s == Status::Timeout)
      throw TimeoutError(store_detail::timeout_message(r.strs(), timeout, "the store at " + impl_->address));
    impl_->throw_status(s, r);
  });
}

bool TcpStore::remove(const std::string& key) {
  auto frame = Writer().u8(uint8_t(Op::Remove)).str(key).frame();
  return impl_->exchange(frame, [&](Status s, Reader& r) -> bool {
    if (s == Status::Ok) return r.u8() != 0;
    impl_->throw_status(s, r);
  });
}

// ---------------------------------------------------------------------------

std::pair<std::string, uint16_t> parse_host_port(const std::string& endpoint) {
  auto bad = [&](const std::string& why) -> InvalidUsage {
    return InvalidUsage("invalid endpoint '" + endpoint + "': " + why +
                        " (expected host:port, IPv6 as [addr]:port)");
  };
  std::string host, port_text;
  if (!endpoint.empty() && endpoint[0] == '[') {
    size_t close = endpoint.find(']');
    if (close == std::string::npos) throw bad("missing ']'");
    host = endpoint.substr(1, close - 1);
    if (close + 1 >= endpoint.size() || endpoint[close + 1] != ':') throw bad("missing ':port' after ']'");
    port_text = endpoint.substr(close + 2);
  } else {
    size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos) throw bad("missing ':port'");
    host = endpoint.substr(0, colon);
    if (host.find(':') != std::string::npos) throw bad("an IPv6 address needs brackets");
    port_text = endpoint.substr(colon + 1);
  }
  if (host.empty()) throw bad("empty host");
  if (port_text.empty()) throw bad("empty port");
  auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  if (port_text.size() > 5 || !std::all_of(port_text.begin(), port_text.end(), digit))
    throw bad("port '" + port_text + "' is not a number");
  unsigned long port = std::stoul(port_text);
  if (port > 65535) throw bad("port " + port_text + " is above 65535");
  return {host, static_cast<uint16_t>(port)};
}

std::string make_job_token() {
  uint8_t raw[16];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(std::string("cannot open /dev/urandom for the job token: ") + errno_text(errno));
  size_t off = 0;
  while (off < sizeof raw) {
    ssize_t n = ::read(fd, raw + off, sizeof raw - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw IoError(std::string("cannot read /dev/urandom for the job token: ") + errno_text(err));
    }
    off += static_cast<size_t>(n);
  }
  ::close(fd);
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (uint8_t b : raw) {
    token += hex[b >> 4];
    token += hex[b & 15];
  }
  return token;
}

}  // namespace dtrain
