#include <grpcpp/version_info.h>

#include "communicator.h"

namespace {

constexpr uint64_t kCaps = DT_CAP_PS_DENSE | DT_CAP_PS_SPARSE | DT_CAP_PS_SERVER | DT_CAP_CPU_BUFFERS;

}  // namespace

namespace dtrain::ps_grpc {

// The [ps_grpc] keys: each once, its default in PsOptions (options.h), its bound and doc here.
const sdk::ConfigTable<PsOptions>& ps_keys() {
  using K = PsOptions;
  static const sdk::ConfigTable<K> table(
      "ps_grpc",
      {
          {"shard_num", &K::shard_num, sdk::in_range(1, 1 << 20),
           "sparse shards in the whole job (keys hash to shards, shards go round-robin to servers)"},
          {"address", &K::address,
           "servers: address to bind and publish (default: 127.0.0.1 on one host, else DTRAIN_HOST_IP, else the "
           "hostname's address)"},
          {"port", &K::port, sdk::in_range(0, 65535),
           "servers: port to bind (0: any free port, published through the store)"},
          {"chunk_bytes", &K::chunk_bytes, sdk::in_range(4096, 1 << 30),
           "largest payload of one gRPC message; larger requests travel in chunks"},
          {"max_request_bytes", &K::max_request_bytes, sdk::at_least(1),
           "servers: largest request (all chunks) one call may send to one server; larger ones are refused"},
          {"threads", &K::threads, sdk::in_range(0, 4096),
           "servers: most gRPC request threads (0: gRPC's default, unbounded)"},
          {"channels", &K::channels, sdk::in_range(1, 64), "workers: gRPC channels (TCP connections) per server"},
          {"wait_spin_us", &K::wait_spin_us, sdk::in_range(0, 1000000),
           "workers: microseconds a wait on a small pull or push (at most 64 KiB) polls, yielding, before it sleeps "
           "(0: sleeps at once); the reply then finds the caller running instead of waking it"},
          {"keep_memory", &K::keep_memory,
           "servers: the process's malloc keeps the memory it frees (mallopt: no page faults on gRPC's request "
           "buffers anew for every large request)"},
      });
  return table;
}

}  // namespace dtrain::ps_grpc

DTRAIN_EXPORT_BACKEND_V1_TABLE(dtrain::ps_grpc::PsCommunicator, "ps_grpc", "0.1.0 (gRPC " GRPC_CPP_VERSION_STRING ")",
                               "parameter server over gRPC: dense and sparse tables, sync/async/GEO", kCaps,
                               dtrain::ps_grpc::ps_keys())
