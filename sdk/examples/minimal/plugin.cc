#include "communicator.h"

namespace {
const dt_config_key_v1_t kKeys[] = {
    {"verbose", "bool", "false", "log one line per communicator"},
};
constexpr uint64_t kCaps = DT_CAP_ALLREDUCE | DT_CAP_BROADCAST | DT_CAP_ALLGATHER | DT_CAP_REDUCE_SCATTER |
                           DT_CAP_REDUCE | DT_CAP_ALLTOALL | DT_CAP_BARRIER | DT_CAP_SENDRECV | DT_CAP_CPU_BUFFERS |
                           DT_CAP_REDUCED_PRECISION;
}  // namespace

DTRAIN_EXPORT_BACKEND_V1(example::ExampleCommunicator, "example", "1.0.0",
                         "SDK example: collectives through the rendezvous store", kCaps, kKeys)
