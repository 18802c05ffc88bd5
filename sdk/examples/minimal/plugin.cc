#include "communicator.h"

namespace {
constexpr uint64_t kCaps = DT_CAP_ALLREDUCE | DT_CAP_BROADCAST | DT_CAP_ALLGATHER | DT_CAP_REDUCE_SCATTER |
                           DT_CAP_REDUCE | DT_CAP_ALLTOALL | DT_CAP_BARRIER | DT_CAP_SENDRECV | DT_CAP_CPU_BUFFERS |
                           DT_CAP_REDUCED_PRECISION;
}  // namespace

// The keys, each declared once: its default in ExampleKeys (communicator.h);
// its name, bound (an int or float key's sdk::at_least / in_range) and doc here.
const dtrain::sdk::ConfigTable<example::ExampleKeys>& example::example_keys() {
  using K = ExampleKeys;
  static const dtrain::sdk::ConfigTable<K> table("example",
                                                 {
                                                     {"verbose", &K::verbose, "log one line per communicator"},
                                                 });
  return table;
}

DTRAIN_EXPORT_BACKEND_V1_TABLE(example::ExampleCommunicator, "example", "1.0.0",
                               "SDK example: collectives through the rendezvous store", kCaps, example::example_keys())
