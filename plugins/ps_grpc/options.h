#pragma once
// The [ps_grpc] table, read once at communicator creation.

#include <cstdint>
#include <string>

#include "dtrain/sdk/backend.h"

namespace dtrain::ps_grpc {

// The [ps_grpc] keys; the initializers are the defaults. Each key is
// declared once, with its bound and doc, in ps_keys() (plugin.cc), which reads
// them all: a value out of its bound fails with DT_ERR_INVALID_USAGE naming
// the key, the value and the bound.
struct PsOptions {
  uint32_t shard_num = 64;                  // sparse shards in the whole job (same on every process)
  std::string address;                      // servers: address to bind and publish ("" = automatic)
  int port = 0;                             // servers: port to bind (0 = any free port)
  uint64_t chunk_bytes = 1048576;           // largest message payload
  uint64_t max_request_bytes = 1073741824;  // servers: largest request (all chunks) to one server
  int threads = 0;                          // servers: most request threads (0 = gRPC's default)
  int channels = 1;                         // workers: channels (TCP connections) per server
  int wait_spin_us = 300;                   // workers: a wait on a small op polls this long before it sleeps
  bool keep_memory = true;                  // servers: malloc keeps freed memory (keep_freed_memory)

  // ps_keys().read(init.options).
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

const sdk::ConfigTable<PsOptions>& ps_keys();

}  // namespace dtrain::ps_grpc
