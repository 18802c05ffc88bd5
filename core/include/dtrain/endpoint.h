#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace dtrain {

// "host:port" -> (host, port); IPv6 as "[::1]:port". Throws InvalidUsage naming
// the endpoint and what is wrong with it.
std::pair<std::string, uint16_t> parse_host_port(const std::string& endpoint);

// (host, port) -> "host:port", IPv6 hosts in brackets: the inverse of parse_host_port.
std::string format_host_port(const std::string& host, uint16_t port);

}  // namespace dtrain
