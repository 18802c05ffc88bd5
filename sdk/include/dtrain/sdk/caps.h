#pragma once
// The names of the DT_CAP_* capability bits, for listings and messages: the
// one table, used by the core (`dtrain plugins`) and by plugin authors.
// Header-only, standard C++17.

#include <cstdint>
#include <string>

#include "dtrain/abi/backend_v1.h"

namespace dtrain::sdk {

struct CapName {
  uint64_t bit;
  const char* name;
};

inline constexpr CapName kCapNames[] = {
    {DT_CAP_ALLREDUCE, "allreduce"},
    {DT_CAP_BROADCAST, "broadcast"},
    {DT_CAP_ALLGATHER, "allgather"},
    {DT_CAP_REDUCE_SCATTER, "reduce_scatter"},
    {DT_CAP_REDUCE, "reduce"},
    {DT_CAP_ALLTOALL, "alltoall"},
    {DT_CAP_BARRIER, "barrier"},
    {DT_CAP_SENDRECV, "send/recv"},
    {DT_CAP_CPU_BUFFERS, "cpu"},
    {DT_CAP_CUDA_BUFFERS, "cuda"},
    {DT_CAP_REDUCED_PRECISION, "f16/bf16"},
    {DT_CAP_PS_DENSE, "ps-dense"},
    {DT_CAP_PS_SPARSE, "ps-sparse"},
    {DT_CAP_PS_SERVER, "ps-server"},
};

// The names of the bits set in caps, space-separated, in table order.
inline std::string caps_string(uint64_t caps) {
  std::string s;
  for (const auto& c : kCapNames)
    if (caps & c.bit) s += (s.empty() ? "" : " ") + std::string(c.name);
  return s;
}

}  // namespace dtrain::sdk
