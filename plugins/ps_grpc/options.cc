#include "options.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

namespace dtrain::ps_grpc {

namespace {

std::string hostname_address() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &res) != 0 || !res) return name;
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return buf;
}

}  // namespace

PsOptions PsOptions::parse(const sdk::CommInit& init) { return ps_keys().read(init.options); }

std::string PsOptions::bind_host(const sdk::CommInit& init) const {
  if (!address.empty()) return address;
  if (init.single_host()) return "127.0.0.1";
  if (const char* ip = std::getenv("DTRAIN_HOST_IP"); ip && *ip) return ip;
  return hostname_address();
}

void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int PsOptions::max_message_bytes() const {
  // Room for the message's own fields (table name, counters) beside the payload.
  return static_cast<int>(std::min<uint64_t>(chunk_bytes + (1 << 20), std::numeric_limits<int>::max()));
}

}  // namespace dtrain::ps_grpc
