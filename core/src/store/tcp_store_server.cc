// The TCP store's server: one thread multiplexing every client with epoll, so a
// request costs the same with 8 clients as with 8,192.
// GET and WAIT are held on the server until their keys exist or their deadline
// passes; a client must present the job token in its first frame.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <queue>
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
  using Frame = std::shared_ptr<const std::vector<uint8_t>>;
  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    uint32_t events = 0;  // as registered with epoll
    std::string peer;
    bool authed = false;
    bool closing = false;  // flush the output, then close
    bool dead = false;
    std::vector<uint8_t> in;
    size_t in_off = 0;
    // Answers not yet sent; a value many clients wait for is one shared frame.
    std::deque<Frame> out;
    size_t out_off = 0;
    Clock::time_point hello_deadline;
    // A GET, GETS or WAIT the server holds until its keys exist.
    bool waiting = false;
    Op wait_op = Op::Wait;
    std::vector<std::string> wait_keys;  // still missing
    std::vector<std::string> get_keys;   // GET/GETS: the keys answered with
    Clock::time_point deadline;
  };
  // epoll tags of the two descriptors that are not clients (client ids start at 1).
  static constexpr uint64_t kWakeTag = 0;
  static constexpr uint64_t kListenTag = ~uint64_t(0);
  using Deadline = std::pair<Clock::time_point, uint64_t>;

  std::string host;
  uint16_t port = 0;
  std::string token;
  std::string address;
  int listen_fd = -1;
  int wake_fd = -1;
  int epoll_fd = -1;
  std::atomic<int> refused{0};
  std::thread thread;

  // Owned by the server thread.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_id = 1;
  std::unordered_map<std::string, Bytes> data;
  std::unordered_map<std::string, std::unordered_set<uint64_t>> waiters;
  // GET's answer for a large value, built once and shared by every client that
  // reads it (a join's table: thousands of reads of one value) until it changes.
  std::unordered_map<std::string, Frame> answers;
  // Every held request's and unauthenticated client's deadline; an entry whose
  // client is gone or no longer due then is skipped when it comes up.
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<>> deadlines;
  std::vector<uint64_t> runnable;
  std::vector<uint64_t> dead;
  std::vector<uint8_t> scratch = std::vector<uint8_t>(65536);
  bool accept_failing = false;

  void bind_and_listen();
  void run();
  void accept_all();
  void read_from(Conn& c);
  void process_frames(Conn& c);
  void handle(Conn& c, Reader& r);
  void handle_hello(Conn& c, Reader& r);
  void reply(Conn& c, std::vector<uint8_t> frame) {
    send_frame(c, std::make_shared<const std::vector<uint8_t>>(std::move(frame)));
  }
  void send_frame(Conn& c, Frame frame);
  void flush(Conn& c);
  void watch(Conn& c);
  void kill(Conn& c);
  void refuse(Conn& c, const std::string& reason);
  void start_wait(Conn& c, Op op, std::vector<std::string> missing, int64_t timeout_ms);
  void key_created(const std::string& key);
  void finish_wait(Conn& c, bool timed_out);
  Frame get_answer(const std::string& key);
  void changed(const std::string& key);
  std::vector<uint8_t> values_frame(const std::vector<std::string>& keys);
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
  std::vector<epoll_event> events(512);
  for (;;) {
    int timeout = deadlines.empty() ? -1 : poll_timeout_ms(deadlines.top().first);
    int n = ::epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) {
      detail::logger().error("TCP store {}: epoll_wait failed: {}", address, errno_text(errno));
      std::this_thread::sleep_for(milliseconds(10));
      continue;
    }
    try {
      for (int i = 0; i < n; ++i) {
        uint64_t tag = events[i].data.u64;
        if (tag == kWakeTag) return;
        if (tag == kListenTag) {
          accept_all();
          continue;
        }
        auto it = conns.find(tag);
        if (it == conns.end() || it->second->dead) continue;
        Conn& c = *it->second;
        uint32_t re = events[i].events;
        if (re & EPOLLOUT) flush(c);
        if (c.dead) continue;
        if (c.closing) {
          if (re & (EPOLLHUP | EPOLLERR)) kill(c);
        } else if (re & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
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
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = c->id;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      detail::logger().warn("TCP store {}: cannot watch client {}: {}", address, c->peer, errno_text(errno));
      ::close(fd);
      continue;
    }
    c->events = EPOLLIN;
    deadlines.emplace(c->hello_deadline, c->id);
    conns.emplace(c->id, std::move(c));
  }
}

void TcpStoreServer::Impl::read_from(Conn& c) {
  // One recv per event keeps a fast sender from starving the others. It lands
  // in the server's one scratch buffer, so an idle client holds no more than
  // its unprocessed bytes (thousands of clients, not thousands of 64 KiB).
  ssize_t n;
  while ((n = ::recv(c.fd, scratch.data(), scratch.size(), 0)) < 0 && errno == EINTR) {
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
  if (n > 0) {
    // A frame larger than one read gets its whole size at once (no doubling series).
    size_t avail = c.in.size() - c.in_off;
    if (avail >= 4 && c.in_off == 0) c.in.reserve(std::min<size_t>(4 + load_u32(c.in.data()), kMaxMessage + 4));
    c.in.insert(c.in.end(), scratch.begin(), scratch.begin() + n);
  }
  process_frames(c);
  if (n > 0) return;
  // End of stream or a socket error: drop the client.
  if (!c.authed && !c.closing && !c.dead) {
    refused++;
    detail::logger().warn("TCP store {}: refused client {}: missing job token (it closed the connection first)",
                          address, c.peer);
  }
  kill(c);
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
    } catch (const std::exception& e) {
      // An answer that cannot be built (over the 1 GiB frame limit, out of memory): this request fails.
      reply(c, Writer().u8(uint8_t(Status::Error)).str(e.what()).frame());
    }
  }
  if (c.in_off == c.in.size()) {
    c.in.clear();
    c.in_off = 0;
    if (c.in.capacity() > 4096) c.in.shrink_to_fit();  // after a large request
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
      changed(key);
      return;
    }
    case Op::Get: {
      std::string key = r.str();
      int64_t timeout = r.i64();
      r.end();
      if (data.count(key)) return send_frame(c, get_answer(key));
      c.get_keys = {key};
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
      changed(key);
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
        changed(key);
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
    case Op::GetMany:
    case Op::Wait: {
      auto keys = r.strs();
      int64_t timeout = r.i64();
      r.end();
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (!data.count(k)) missing.push_back(k);
      if (missing.empty())
        return reply(c, op == Op::Wait ? Writer().u8(uint8_t(Status::Ok)).frame() : values_frame(keys));
      if (op == Op::GetMany) c.get_keys = std::move(keys);
      return start_wait(c, op, std::move(missing), timeout);
    }
    case Op::Remove: {
      std::string key = r.str();
      r.end();
      bool existed = data.erase(key) > 0;
      answers.erase(key);
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
  if (timeout_ms <= 0) return finish_wait(c, true);
  if (deadlines.size() > 4 * conns.size() + 1024) {
    // Requests answered early leave their entries behind; drop those.
    std::vector<Deadline> keep;
    for (; !deadlines.empty(); deadlines.pop()) {
      auto [when, id] = deadlines.top();
      auto it = conns.find(id);
      if (it != conns.end() && ((it->second->waiting && it->second->deadline == when) ||
                                (!it->second->authed && it->second->hello_deadline == when)))
        keep.emplace_back(when, id);
    }
    deadlines = decltype(deadlines)(std::greater<>(), std::move(keep));
  }
  deadlines.emplace(c.deadline, c.id);
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

std::vector<uint8_t> TcpStoreServer::Impl::values_frame(const std::vector<std::string>& keys) {
  size_t n = 5;
  for (const auto& k : keys) n += 4 + data.at(k).size();
  if (n > kMaxMessage)
    throw InvalidUsage("the values of " + std::to_string(keys.size()) + " keys (" + std::to_string(n) +
                       " bytes) exceed the 1 GiB answer limit: ask for fewer at once");
  Writer w;
  w.reserve(n).u8(uint8_t(Status::Ok)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.bytes(data.at(k));
  return w.frame();
}

void TcpStoreServer::Impl::changed(const std::string& key) {
  answers.erase(key);
  key_created(key);
}

TcpStoreServer::Impl::Frame TcpStoreServer::Impl::get_answer(const std::string& key) {
  if (auto it = answers.find(key); it != answers.end()) return it->second;
  const Bytes& value = data[key];
  auto f = std::make_shared<const std::vector<uint8_t>>(Writer().u8(uint8_t(Status::Ok)).bytes(value).frame());
  if (value.size() >= 1024 && value.size() <= (size_t(16) << 20)) answers.emplace(key, f);
  return f;
}

void TcpStoreServer::Impl::finish_wait(Conn& c, bool timed_out) {
  drop_waiter(c);
  if (!timed_out && c.wait_op == Op::GetMany) {
    // A key present when GETS came may have been removed since: wait for it again.
    for (const auto& k : c.get_keys)
      if (!data.count(k)) c.wait_keys.push_back(k);
    if (!c.wait_keys.empty()) {
      for (const auto& k : c.wait_keys) waiters[k].insert(c.id);
      return;  // still waiting, under the same deadline (its heap entry stands)
    }
  }
  c.waiting = false;
  try {
    if (timed_out) {
      reply(c, Writer().u8(uint8_t(Status::Timeout)).strs(c.wait_keys).frame());
    } else if (c.wait_op == Op::Get) {
      send_frame(c, get_answer(c.get_keys[0]));
    } else if (c.wait_op == Op::GetMany) {
      reply(c, values_frame(c.get_keys));
    } else {
      reply(c, Writer().u8(uint8_t(Status::Ok)).frame());
    }
  } catch (const std::exception& e) {
    reply(c, Writer().u8(uint8_t(Status::Error)).str(e.what()).frame());
  }
  c.wait_keys.clear();
  c.get_keys.clear();
  runnable.push_back(c.id);
}

void TcpStoreServer::Impl::expire(Clock::time_point now) {
  while (!deadlines.empty() && deadlines.top().first <= now) {
    uint64_t id = deadlines.top().second;
    deadlines.pop();
    auto it = conns.find(id);
    if (it == conns.end() || it->second->dead) continue;
    Conn& c = *it->second;
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

void TcpStoreServer::Impl::kill(Conn& c) {
  if (c.dead) return;
  c.dead = true;
  dead.push_back(c.id);
}

void TcpStoreServer::Impl::reap() {
  for (uint64_t id : dead) {
    auto it = conns.find(id);
    if (it == conns.end()) continue;
    Conn& c = *it->second;
    if (c.waiting) drop_waiter(c);
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);  // a forked child may still hold the descriptor
    ::close(c.fd);
    conns.erase(it);
  }
  dead.clear();
}

void TcpStoreServer::Impl::send_frame(Conn& c, Frame frame) {
  if (c.dead) return;
  c.out.push_back(std::move(frame));
  flush(c);
}

void TcpStoreServer::Impl::flush(Conn& c) {
  while (!c.out.empty()) {
    const auto& f = *c.out.front();
    ssize_t n = ::send(c.fd, f.data() + c.out_off, f.size() - c.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      if (c.out_off == f.size()) {
        c.out.pop_front();
        c.out_off = 0;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return watch(c);
    return kill(c);
  }
  if (c.closing) {
    ::shutdown(c.fd, SHUT_WR);
    return kill(c);
  }
  watch(c);
}

void TcpStoreServer::Impl::watch(Conn& c) {
  uint32_t want = (c.closing ? 0u : uint32_t(EPOLLIN)) | (c.out.empty() ? 0u : uint32_t(EPOLLOUT));
  if (want == c.events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  if (::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev) != 0) return kill(c);
  c.events = want;
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
  Impl& m = *impl_;
  auto close_all = [&m] {
    for (int fd : {m.listen_fd, m.wake_fd, m.epoll_fd})
      if (fd >= 0) ::close(fd);
  };
  m.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  m.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  bool watched = m.wake_fd >= 0 && m.epoll_fd >= 0;
  for (auto [fd, tag] : {std::pair{m.wake_fd, Impl::kWakeTag}, std::pair{m.listen_fd, Impl::kListenTag}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    watched = watched && ::epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0;
  }
  if (!watched) {
    int err = errno;
    close_all();
    throw IoError("TCP store " + m.address + ": cannot set up its event loop: " + errno_text(err));
  }
  try {
    m.thread = std::thread([impl = impl_.get()] { impl->run(); });
  } catch (...) {
    close_all();
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
  ::close(impl_->epoll_fd);
}

uint16_t TcpStoreServer::port() const { return impl_->port; }
const std::string& TcpStoreServer::host() const { return impl_->host; }
int TcpStoreServer::refused_clients() const { return impl_->refused.load(); }

}  // namespace dtrain
