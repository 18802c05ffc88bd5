#include "net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dtrain::launch {

namespace {

std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  return buf;
}

struct AddrList {
  addrinfo* head = nullptr;
  ~AddrList() {
    if (head) freeaddrinfo(head);
  }
};

int resolve(const std::string& host, uint16_t port, int flags, AddrList& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  return getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &out.head);
}

}  // namespace

std::vector<LocalAddress> local_addresses() {
  std::vector<LocalAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6)) continue;
    out.push_back({a->ifa_name, numeric(a->ifa_addr)});
  }
  freeifaddrs(list);
  return out;
}

std::string resolve_host(const std::string& host) {
  AddrList res;
  if (resolve(host, 0, 0, res) != 0 || !res.head) return "";
  return numeric(res.head->ai_addr);
}

std::string local_iface_of(const std::string& ip) {
  std::string numeric_ip = resolve_host(ip);
  for (const LocalAddress& a : local_addresses())
    if (a.ip == ip || a.ip == numeric_ip) return a.iface;
  return "";
}

std::string source_ip_for(const std::string& host) {
  if (!local_iface_of(host).empty()) return resolve_host(host);
  AddrList res;
  if (resolve(host, 9, 0, res) == 0 && res.head) {
    int fd = socket(res.head->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      // connect() on a UDP socket sends nothing: it only looks up the route.
      bool ok = connect(fd, res.head->ai_addr, res.head->ai_addrlen) == 0 &&
                getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0;
      close(fd);
      if (ok) return numeric(reinterpret_cast<sockaddr*>(&ss));
    }
  }
  for (auto& a : local_addresses())
    if (a.iface != "lo" && a.ip.find(':') == std::string::npos) return a.ip;
  return "";
}

uint16_t pick_free_port(const std::string& host) {
  AddrList res;
  if (resolve(host, 0, AI_PASSIVE, res) != 0 || !res.head) return 0;
  int fd = socket(res.head->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  uint16_t port = 0;
  if (bind(fd, res.head->ai_addr, res.head->ai_addrlen) == 0) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    port = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                         : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  }
  close(fd);
  return port;
}

std::string port_bind_problem(const std::string& host, uint16_t port) {
  AddrList res;
  int rc = resolve(host, port, AI_PASSIVE, res);
  if (rc != 0 || !res.head) return std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
  int fd = socket(res.head->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  std::string problem;
  if (bind(fd, res.head->ai_addr, res.head->ai_addrlen) != 0) problem = std::strerror(errno);
  close(fd);
  return problem;
}

std::string tcp_probe(const std::string& host, uint16_t port, int timeout_ms) {
  AddrList res;
  int rc = resolve(host, port, 0, res);
  if (rc != 0 || !res.head) return std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
  int fd = socket(res.head->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return std::strerror(errno);
  std::string problem;
  if (connect(fd, res.head->ai_addr, res.head->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      problem = std::strerror(errno);
    } else {
      pollfd p{fd, POLLOUT, 0};
      int n = poll(&p, 1, timeout_ms);
      if (n == 0) {
        problem = "timed out after " + std::to_string(timeout_ms) + " ms";
      } else {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) problem = std::strerror(err);
      }
    }
  }
  close(fd);
  return problem;
}

std::string this_hostname() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace dtrain::launch
