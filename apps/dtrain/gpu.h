#pragma once
// The CUDA devices this machine shows the launcher, for --gpus. Read through
// the driver library (libcuda.so.1, loaded at run time, so `dtrain` itself
// needs no CUDA to build or run) and subject to CUDA_VISIBLE_DEVICES, as the
// workers will be.

#include <string>
#include <vector>

namespace dtrain::launch {

struct CudaDevices {
  std::vector<std::string> names;  // index = the id --gpus and DTRAIN_DEVICE use
  std::string problem;             // why there are none: no driver, cuInit's error, ...
};

// DTRAIN_FAKE_GPU_COUNT=N (tests only) reports N devices named "fake device i"
// without touching the driver, so the launcher's device layout is testable on
// a machine without a GPU.
CudaDevices probe_cuda_devices();

// Refuses (InvalidUsage) a --gpus entry that is not a device of `found`, naming
// the devices there are, or saying why there are none and what to use instead.
void check_devices(const std::vector<std::string>& requested, const CudaDevices& found);

}  // namespace dtrain::launch
