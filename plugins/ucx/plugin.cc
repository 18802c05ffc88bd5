#include "communicator.h"
#include "dtrain/sdk/cuda_staging.h"

namespace {

constexpr uint64_t kCaps = DT_CAP_ALLREDUCE | DT_CAP_BROADCAST | DT_CAP_ALLGATHER | DT_CAP_REDUCE_SCATTER |
                           DT_CAP_REDUCE | DT_CAP_ALLTOALL | DT_CAP_BARRIER | DT_CAP_SENDRECV | DT_CAP_CPU_BUFFERS |
                           DT_CAP_CUDA_BUFFERS | DT_CAP_REDUCED_PRECISION;

}  // namespace

namespace dtrain::ucx_backend {

// The [ucx] keys: each once, its default in UcxKeys (options.h), its bound and doc here.
const sdk::ConfigTable<UcxKeys>& ucx_keys() {
  using K = UcxKeys;
  static const sdk::ConfigTable<K> table(
      "ucx",
      {
          {"tls", &K::tls,
           "UCX transports (UCX_TLS syntax, e.g. \"sm,cma\" or \"tcp\"); empty: UCX's default (UCX_TLS or all)"},
          {"net_devices", &K::net_devices,
           "network devices (UCX_NET_DEVICES syntax); empty: \"lo\" when every rank is on one host, else all "
           "(UCX_NET_DEVICES in the environment wins over the default)"},
          {"error_handling", &K::error_handling,
           "UCX peer-failure handling: auto (only for peers on other hosts: on one host UCX 1.13 would otherwise "
           "fall back from shared memory to TCP), peer, none"},
          {"shared_memory", &K::shared_memory,
           "ring steps between ranks of one host go through shared-memory mailboxes mapped by UCX (ucp_rkey_ptr) "
           "instead of tag messages (CMA rendezvous)"},
          {"algorithm", &K::algorithm,
           "all-reduce algorithm: auto (recursive_doubling up to small_message_bytes, ring above), "
           "recursive_doubling, ring"},
          {"small_message_bytes", &K::small_message_bytes, sdk::at_least(0),
           "auto: messages up to this size use recursive doubling"},
          {"chunk_bytes", &K::chunk_bytes, sdk::at_least(4096),
           "ring pipeline chunk: each chunk is reduced as soon as it lands"},
          {"pipeline_depth", &K::pipeline_depth, sdk::at_least(1), "ring chunks in flight per step"},
          {"stream_bytes", &K::stream_bytes, sdk::at_least(0),
           "ops of at least this many bytes write the shared-memory mailboxes with non-temporal stores (0: never)"},
          {"adaptive_stream", &K::adaptive_stream,
           "ring all-reduces on shared memory below stream_bytes use plain or non-temporal stores, whichever took "
           "less time per byte over the last ops (the other is retried every 32nd op); false: plain stores"},
          {"spin_us", &K::spin_us, sdk::at_least(0),
           "busy-poll this long before sleeping on the worker's event fd (or in 20 us steps on shared memory)"},
          {"grace_us", &K::grace_us, sdk::at_least(0),
           "a collective nobody waits for is run by the communicator's background thread after this long"},
      });
  return table;
}

}  // namespace dtrain::ucx_backend

// CUDA buffers go through pinned host memory (sdk/cuda_staging.h).
DTRAIN_EXPORT_BACKEND_V1_TABLE(dtrain::sdk::CudaStaged<dtrain::ucx_backend::UcxCommunicator>, "ucx", "0.1.0 (UCX 1.13)",
                               "CPU collectives over UCX: shared memory and CMA on one host, TCP or RDMA across hosts",
                               kCaps, dtrain::ucx_backend::ucx_keys())
