#pragma once
// The [ps_grpc] table, read once at communicator creation.

#include <cstdint>
#include <string>

#include "dtrain/sdk/backend.h"

namespace dtrain::ps_grpc {

// A value out of range fails with DT_ERR_INVALID_USAGE naming the key.
struct PsOptions {
  uint32_t shard_num = 64;                  // sparse shards in the whole job (same on every process)
  std::string address;                      // servers: address to bind and publish ("" = automatic)
  int port = 0;                             // servers: port to bind (0 = any free port)
  uint64_t chunk_bytes = 4ull << 20;        // largest message payload
  uint64_t max_request_bytes = 1ull << 30;  // servers: largest request (all chunks) to one server
  int threads = 0;                          // servers: most request threads (0 = gRPC's default)
  int channels = 1;                         // workers: channels (TCP connections) per server

  static PsOptions parse(const sdk::CommInit& init);
  // The address a server binds and publishes: the option, else 127.0.0.1 when
  // the whole job is on this host, else DTRAIN_HOST_IP, else the hostname's
  // IPv4 address.
  std::string bind_host(const sdk::CommInit& init) const;
  // gRPC's receive limit for a channel whose messages carry at most chunk_bytes.
  int max_message_bytes() const;
};

}  // namespace dtrain::ps_grpc
