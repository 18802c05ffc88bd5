#include <grpcpp/version_info.h>

#include "communicator.h"

namespace {

const dt_config_key_v1_t kKeys[] = {
    {"shard_num", "int", "64",
     "sparse shards in the whole job (keys hash to shards, shards go round-robin to servers)"},
    {"address", "string", "\"\"",
     "servers: address to bind and publish (default: 127.0.0.1 on one host, else DTRAIN_HOST_IP, else the "
     "hostname's address)"},
    {"port", "int", "0", "servers: port to bind (0: any free port, published through the store)"},
    {"chunk_bytes", "int", "1048576", "largest payload of one gRPC message; larger requests travel in chunks"},
    {"max_request_bytes", "int", "1073741824",
     "servers: largest request (all chunks) one call may send to one server; larger ones are refused"},
    {"threads", "int", "0", "servers: most gRPC request threads (0: gRPC's default, unbounded)"},
    {"channels", "int", "1", "workers: gRPC channels (TCP connections) per server"},
    {"wait_spin_us", "int", "300",
     "workers: microseconds a wait on a small pull or push (at most 64 KiB) polls, yielding, before it sleeps "
     "(0: sleeps at once); the reply then finds the caller running instead of waking it"},
    {"keep_memory", "bool", "true",
     "servers: the process's malloc keeps the memory it frees (mallopt: no page faults on gRPC's request "
     "buffers anew for every large request)"},
};

constexpr uint64_t kCaps = DT_CAP_PS_DENSE | DT_CAP_PS_SPARSE | DT_CAP_PS_SERVER | DT_CAP_CPU_BUFFERS;

}  // namespace

DTRAIN_EXPORT_BACKEND_V1(dtrain::ps_grpc::PsCommunicator, "ps_grpc", "0.1.0 (gRPC " GRPC_CPP_VERSION_STRING ")",
                         "parameter server over gRPC: dense and sparse tables, sync/async/GEO", kCaps, kKeys)
