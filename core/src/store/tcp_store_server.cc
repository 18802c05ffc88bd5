// The TCP store's server: one thread multiplexing every client with poll().
// GET and WAIT are held on the server until their keys exist or their deadline
// passes; a client must present the job token in its first frame.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/log.h"
#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/store_util.h"
#include "store/tcp_store_codec.h"

namespace dtrain {
namespace {

using namespace tcp_store_detail;
using std::chrono::milliseconds;

// A client that has not sent its token by then is refused.
constexpr auto kHelloTimeout = std::chrono::seconds(30);

std::string sockaddr_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    return format_host_port(buf, ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    return format_host_port(buf, ntohs(in6->sin6_port));
  }
  return "unknown address";
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

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
  address = format_host_port(host, port);
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
        value =
            store_detail::checked_add(key, it == data.end() ? 0 : store_detail::parse_counter(key, it->second), delta);
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
    default: throw ProtocolError("unknown operation " + std::to_string(int(op)));
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
  impl_->address = format_host_port(host, port);
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

}  // namespace dtrain
