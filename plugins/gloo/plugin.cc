#include "communicator.h"
#include "dtrain/sdk/cuda_staging.h"

namespace {

const dt_config_key_v1_t kKeys[] = {
    {"algorithm", "string", "\"auto\"",
     "all-reduce algorithm: auto (bcube up to small_message_bytes, ring above), ring, halving_doubling, bcube"},
    {"small_message_bytes", "int", "0",
     "auto: messages up to this size use bcube; 0 = by world size (16 MiB for 2 ranks, 1 MiB for more)"},
    {"bcube_base", "int", "2", "group size of the bcube algorithm"},
    {"iface", "string", "\"\"", "network interface to use (default: lo for single-host jobs, else the hostname)"},
    {"hostname", "string", "\"\"", "address to bind instead of an interface"},
};

constexpr uint64_t kCaps = DT_CAP_ALLREDUCE | DT_CAP_BROADCAST | DT_CAP_ALLGATHER | DT_CAP_REDUCE_SCATTER |
                           DT_CAP_REDUCE | DT_CAP_ALLTOALL | DT_CAP_BARRIER | DT_CAP_SENDRECV | DT_CAP_CPU_BUFFERS |
                           DT_CAP_CUDA_BUFFERS | DT_CAP_REDUCED_PRECISION;

}  // namespace

// CUDA buffers go through pinned host memory (sdk/cuda_staging.h).
DTRAIN_EXPORT_BACKEND_V1(dtrain::sdk::CudaStaged<dtrain::gloo_backend::GlooCommunicator>, "gloo", "0.1.0 (Gloo 0.5.0)",
                         "CPU collectives over Gloo's TCP transport", kCaps, kKeys)
