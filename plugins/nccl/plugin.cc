#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "communicator.h"

namespace {

constexpr uint64_t kCaps = DT_CAP_ALLREDUCE | DT_CAP_BROADCAST | DT_CAP_ALLGATHER | DT_CAP_REDUCE_SCATTER |
                           DT_CAP_REDUCE | DT_CAP_ALLTOALL | DT_CAP_BARRIER | DT_CAP_SENDRECV | DT_CAP_CUDA_BUFFERS |
                           DT_CAP_REDUCED_PRECISION;

std::string dotted(int major, int minor, int patch = -1) {
  return std::to_string(major) + "." + std::to_string(minor) + (patch >= 0 ? "." + std::to_string(patch) : "");
}

// The loaded libnccl's version (2.9+ codes: major*10000 + minor*100 + patch).
std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess || v <= 0) return "unknown";
  return v >= 10000 ? dotted(v / 10000, v % 10000 / 100, v % 100) : dotted(v / 1000, v % 1000 / 100, v % 100);
}

// "12.4" from 12040; "none" when no driver is installed.
std::string cuda_version(cudaError_t st, int v) {
  if (st != cudaSuccess || v <= 0) return "none";
  return dotted(v / 1000, v % 1000 / 10);
}

// "0.1.0 (NCCL 2.28.9)": the loaded libnccl, as gloo's names its Gloo.
const char* version_string() {
  static const std::string s = "0.1.0 (NCCL " + nccl_version() + ")";
  return s.c_str();
}

const char* description_string() {
  static const std::string s = [] {
    int rt = 0, drv = 0;
    cudaError_t rst = cudaRuntimeGetVersion(&rt);
    cudaError_t dst = cudaDriverGetVersion(&drv);
    cudaGetLastError();
    std::string found;
    for (const char* name : dtrain::nccl_backend::kNewerEntryPoints)
      if (dtrain::nccl_backend::find_nccl_symbol(name)) found += std::string(found.empty() ? "" : " ") + name;
    return "GPU collectives over NCCL " + nccl_version() + " (built against " +
           dotted(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) + "), CUDA runtime " + cuda_version(rst, rt) + ", driver " +
           cuda_version(dst, drv) + "; CUDA buffers only; newer entry points: " + (found.empty() ? "none" : found);
  }();
  return s.c_str();
}

}  // namespace

namespace dtrain::nccl_backend {

// The [nccl] keys: each once, its default in NcclKeys (communicator.h), its bound and doc here.
const sdk::ConfigTable<NcclKeys>& nccl_keys() {
  using K = NcclKeys;
  static const sdk::ConfigTable<K> table(
      "nccl", {
                  {"device", &K::device, sdk::at_least(-1),
                   "CUDA device of this rank; -1 = the launcher's DTRAIN_DEVICE, else local rank modulo the visible "
                   "devices"},
              });
  return table;
}

}  // namespace dtrain::nccl_backend

DTRAIN_EXPORT_BACKEND_V1_TABLE(dtrain::nccl_backend::NcclCommunicator, "nccl", version_string(), description_string(),
                               kCaps, dtrain::nccl_backend::nccl_keys())
