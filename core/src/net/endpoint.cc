#include "dtrain/endpoint.h"

#include <algorithm>

#include "dtrain/error.h"

namespace dtrain {

std::pair<std::string, uint16_t> parse_host_port(const std::string& endpoint) {
  auto bad = [&](const std::string& why) -> InvalidUsage {
    return InvalidUsage("invalid endpoint '" + endpoint + "': " + why + " (expected host:port, IPv6 as [addr]:port)");
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

std::string format_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

}  // namespace dtrain
