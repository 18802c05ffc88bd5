#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::launch {

struct LocalAddress {
  std::string iface;
  std::string ip;
};
// IPv4/IPv6 addresses of this machine's interfaces (getifaddrs).
std::vector<LocalAddress> local_addresses();
// The interface carrying ip on this machine, or "" if ip is not local.
std::string local_iface_of(const std::string& ip);
// Resolves a host name to one numeric address ("" on failure).
std::string resolve_host(const std::string& host);
// The address this machine sends from to reach host: host itself when it is
// local, else the source address of the kernel's route to it (the interface
// the job's traffic will use), else the first non-loopback IPv4 address.
std::string source_ip_for(const std::string& host);
// A port that was free on host a moment ago (bind to port 0, read, close).
uint16_t pick_free_port(const std::string& host);
// "" if nothing listens on host:port yet and it can be bound; else why not.
std::string port_bind_problem(const std::string& host, uint16_t port);
// Tries a TCP connection within timeout_ms: "" on success, else the reason
// ("connection refused", "timed out after 2000 ms", ...).
std::string tcp_probe(const std::string& host, uint16_t port, int timeout_ms);
std::string this_hostname();

}  // namespace dtrain::launch
