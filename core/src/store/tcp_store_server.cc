// The TCP store's server: one thread multiplexing every client with epoll, so a
// request costs the same with 8 clients as with 8,192; its connections, reads
// and writes. What a request does is tcp_store_server_ops.cc.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"
#include "dtrain/endpoint.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/store_util.h"
#include "store/tcp_store_server_impl.h"

namespace dtrain {
namespace {

using std::chrono::milliseconds;

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

}  // namespace

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
