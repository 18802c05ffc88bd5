#include "communicator.h"
#include "dtrain/sdk/cuda_staging.h"

namespace {

const dt_config_key_v1_t kKeys[] = {
    {"tls", "string", "\"\"",
     "UCX transports (UCX_TLS syntax, e.g. \"sm,cma\" or \"tcp\"); empty: UCX's default (UCX_TLS or all)"},
    {"net_devices", "string", "\"\"",
     "network devices (UCX_NET_DEVICES syntax); empty: \"lo\" when every rank is on one host, else all "
     "(UCX_NET_DEVICES in the environment wins over the default)"},
    {"error_handling", "string", "\"auto\"",
     "UCX peer-failure handling: auto (only for peers on other hosts: on one host UCX 1.13 would otherwise fall "
     "back from shared memory to TCP), peer, none"},
    {"shared_memory", "bool", "true",
     "ring steps between ranks of one host go through shared-memory mailboxes mapped by UCX (ucp_rkey_ptr) "
     "instead of tag messages (CMA rendezvous)"},
    {"algorithm", "string", "\"auto\"",
     "all-reduce algorithm: auto (recursive_doubling up to small_message_bytes, ring above), recursive_doubling, "
     "ring"},
    {"small_message_bytes", "int", "8192", "auto: messages up to this size use recursive doubling"},
    {"chunk_bytes", "int", "131072", "ring pipeline chunk: each chunk is reduced as soon as it lands"},
    {"pipeline_depth", "int", "8", "ring chunks in flight per step"},
    {"stream_bytes", "int", "8388608",
     "ops of at least this many bytes write the shared-memory mailboxes with non-temporal stores (0: never)"},
    {"adaptive_stream", "bool", "true",
     "ring all-reduces on shared memory below stream_bytes use plain or non-temporal stores, whichever took less time "
     "per byte over the last ops (the other is retried every 32nd op); false: plain stores"},
    {"spin_us", "int", "2000",
     "busy-poll this long before sleeping on the worker's event fd (or in 20 us steps on shared memory)"},
    {"grace_us", "int", "1000",
     "a collective nobody waits for is run by the communicator's background thread after this long"},
};

constexpr uint64_t kCaps = DT_CAP_ALLREDUCE | DT_CAP_BROADCAST | DT_CAP_ALLGATHER | DT_CAP_REDUCE_SCATTER |
                           DT_CAP_REDUCE | DT_CAP_ALLTOALL | DT_CAP_BARRIER | DT_CAP_SENDRECV | DT_CAP_CPU_BUFFERS |
                           DT_CAP_CUDA_BUFFERS | DT_CAP_REDUCED_PRECISION;

}  // namespace

// CUDA buffers go through pinned host memory (sdk/cuda_staging.h).
DTRAIN_EXPORT_BACKEND_V1(dtrain::sdk::CudaStaged<dtrain::ucx_backend::UcxCommunicator>, "ucx", "0.1.0 (UCX 1.13)",
                         "CPU collectives over UCX: shared memory and CMA on one host, TCP or RDMA across hosts", kCaps,
                         kKeys)
