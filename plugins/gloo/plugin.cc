#include "communicator.h"
#include "dtrain/sdk/cuda_staging.h"

namespace {

constexpr uint64_t kCaps = DT_CAP_ALLREDUCE | DT_CAP_BROADCAST | DT_CAP_ALLGATHER | DT_CAP_REDUCE_SCATTER |
                           DT_CAP_REDUCE | DT_CAP_ALLTOALL | DT_CAP_BARRIER | DT_CAP_SENDRECV | DT_CAP_CPU_BUFFERS |
                           DT_CAP_CUDA_BUFFERS | DT_CAP_REDUCED_PRECISION;

}  // namespace

namespace dtrain::gloo_backend {

// The [gloo] keys: each once, its default in GlooKeys (communicator.h), its bound and doc here.
const sdk::ConfigTable<GlooKeys>& gloo_keys() {
  using K = GlooKeys;
  static const sdk::ConfigTable<K> table(
      "gloo",
      {
          {"algorithm", &K::algorithm,
           "all-reduce algorithm: auto (ring up to one element a rank, bcube up to small_message_bytes, ring above), "
           "ring, halving_doubling, bcube"},
          {"small_message_bytes", &K::small_message_bytes, sdk::at_least(0),
           "auto: messages of more than one element a rank up to this size use bcube; 0 = by world size (16 MiB "
           "for 2 ranks, 1 MiB for more)"},
          {"bcube_base", &K::bcube_base, sdk::at_least(2), "group size of the bcube algorithm"},
          {"iface", &K::iface, "network interface to use (default: lo for single-host jobs, else the hostname)"},
          {"hostname", &K::hostname, "address to bind instead of an interface"},
      });
  return table;
}

}  // namespace dtrain::gloo_backend

// CUDA buffers go through pinned host memory (sdk/cuda_staging.h).
DTRAIN_EXPORT_BACKEND_V1_TABLE(dtrain::sdk::CudaStaged<dtrain::gloo_backend::GlooCommunicator>, "gloo",
                               "0.1.0 (Gloo 0.5.0)", "CPU collectives over Gloo's TCP transport", kCaps,
                               dtrain::gloo_backend::gloo_keys())
