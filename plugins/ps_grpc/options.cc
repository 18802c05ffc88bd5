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

// The value set, else kKeys' default (plugin.cc), checked against [lo, hi].
int64_t in_range(const sdk::Options& o, const char* key, int64_t lo, int64_t hi) {
  int64_t v = o.get_int(key);
  if (v < lo || v > hi)
    sdk::fail(DT_ERR_INVALID_USAGE, std::string("ps_grpc.") + key + " = " + std::to_string(v) + " is out of range [" +
                                        std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

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

PsOptions PsOptions::parse(const sdk::CommInit& init) {
  const sdk::Options& o = init.options;
  PsOptions p;
  p.shard_num = static_cast<uint32_t>(in_range(o, "shard_num", 1, 1 << 20));
  p.address = o.get_string("address");
  p.port = static_cast<int>(in_range(o, "port", 0, 65535));
  p.chunk_bytes = static_cast<uint64_t>(in_range(o, "chunk_bytes", 4096, 1 << 30));
  p.max_request_bytes = static_cast<uint64_t>(in_range(o, "max_request_bytes", 1, std::numeric_limits<int64_t>::max()));
  p.threads = static_cast<int>(in_range(o, "threads", 0, 4096));
  p.channels = static_cast<int>(in_range(o, "channels", 1, 64));
  p.wait_spin_us = static_cast<int>(in_range(o, "wait_spin_us", 0, 1000000));
  p.keep_memory = o.get_bool("keep_memory");
  return p;
}

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
