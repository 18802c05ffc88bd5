#pragma once
// The [ps_grpc] table, read once at communicator creation.

#include <cstdint>
#include <string>

#include "dtrain/sdk/backend.h"

namespace dtrain::ps_grpc {

// A value out of range fails with DT_ERR_INVALID_USAGE naming the key. The
// defaults are those of the key table (kKeys in plugin.cc), their one place;
// parse() reads every key, so a PsOptions holds no default of its own.
struct PsOptions {
  uint32_t shard_num = 0;          // sparse shards in the whole job (same on every process)
  std::string address;             // servers: address to bind and publish ("" = automatic)
  int port = 0;                    // servers: port to bind (0 = any free port)
  uint64_t chunk_bytes = 0;        // largest message payload
  uint64_t max_request_bytes = 0;  // servers: largest request (all chunks) to one server
  int threads = 0;                 // servers: most request threads (0 = gRPC's default)
  int channels = 0;                // workers: channels (TCP connections) per server
  int wait_spin_us = 0;            // workers: a wait on a small op polls this long before it sleeps
  bool keep_memory = false;        // servers: malloc keeps freed memory (keep_freed_memory)

  static PsOptions parse(const sdk::CommInit& init);
  // The address a server binds and publishes: the option, else 127.0.0.1 when
  // the whole job is on this host, else DTRAIN_HOST_IP, else the hostname's
  // IPv4 address.
  std::string bind_host(const sdk::CommInit& init) const;
  // gRPC's receive limit for a channel whose messages carry at most chunk_bytes.
  int max_message_bytes() const;
};

// Makes this process's malloc keep the memory it frees (trim threshold 1 GiB,
// blocks under 32 MiB from the heap, not mmap): gRPC allocates the buffers a
// large request is read into and frees them after the handler, and glibc
// gave that memory back to the kernel, so every 16 MB push page-faulted it
// in anew (a 16 MB push to one server: 0.9-1.1 -> 1.4-1.7 GB/s here).
// Process-wide.
void keep_freed_memory();

}  // namespace dtrain::ps_grpc
