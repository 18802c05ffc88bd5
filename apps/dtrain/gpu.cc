#include "gpu.h"

#include <dlfcn.h>

#include <cstdlib>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::launch {

namespace {

// The few driver entry points used, with the driver API's C types spelled as
// plain ints (CUresult, CUdevice) so that no CUDA header is needed.
using InitFn = int (*)(unsigned);
using CountFn = int (*)(int*);
using GetFn = int (*)(int*, int);
using NameFn = int (*)(char*, int, int);
using ErrorStringFn = int (*)(int, const char**);

std::string driver_error(void* lib, int rc) {
  const char* text = nullptr;
  if (auto fn = reinterpret_cast<ErrorStringFn>(dlsym(lib, "cuGetErrorString")); fn && fn(rc, &text) == 0 && text)
    return fmt::format("{} (CUresult {})", text, rc);
  return fmt::format("CUresult {}", rc);
}

}  // namespace

CudaDevices probe_cuda_devices() {
  CudaDevices d;
  if (const char* fake = std::getenv("DTRAIN_FAKE_GPU_COUNT"); fake && *fake) {
    char* end = nullptr;
    long n = std::strtol(fake, &end, 10);
    if (*end != '\0' || n < 0 || n > 1024)
      throw InvalidUsage(fmt::format("DTRAIN_FAKE_GPU_COUNT='{}' is not a device count", fake));
    for (long i = 0; i < n; ++i) d.names.push_back(fmt::format("fake device {}", i));
    if (n == 0) d.problem = "DTRAIN_FAKE_GPU_COUNT=0 shows no device";
    return d;
  }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    d.problem = "no NVIDIA driver: libcuda.so.1 cannot be loaded";
    return d;
  }
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count_fn = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  auto get = reinterpret_cast<GetFn>(dlsym(lib, "cuDeviceGet"));
  auto name_fn = reinterpret_cast<NameFn>(dlsym(lib, "cuDeviceGetName"));
  if (!init || !count_fn || !get || !name_fn) {
    d.problem = "libcuda.so.1 lacks the driver API (cuInit, cuDeviceGetCount)";
  } else if (int rc = init(0); rc != 0) {
    d.problem = "the NVIDIA driver does not start: cuInit: " + driver_error(lib, rc);
  } else {
    int count = 0;  // written only on success
    if (int rc2 = count_fn(&count); rc2 != 0) {
      d.problem = "cuDeviceGetCount: " + driver_error(lib, rc2);
    } else {
      for (int i = 0; i < count; ++i) {
        int dev = 0;
        char name[256] = "";
        if (get(&dev, i) != 0 || name_fn(name, sizeof name, dev) != 0) std::snprintf(name, sizeof name, "device %d", i);
        d.names.push_back(name);
      }
      if (count == 0) d.problem = "the NVIDIA driver shows no device";
    }
  }
  // The driver stays loaded: unloading it after cuInit is not supported.
  return d;
}

void check_devices(const std::vector<std::string>& requested, const CudaDevices& found) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string scope = visible ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", visible) : "";
  std::vector<long> ids;
  for (const std::string& r : requested) {
    char* end = nullptr;
    long id = std::strtol(r.c_str(), &end, 10);
    if (r.empty() || *end != '\0' || id < 0)
      throw InvalidUsage(fmt::format("--gpus: '{}' is not a device number; give ids such as --gpus 0,1", r));
    ids.push_back(id);
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string& r = requested[k];
    long id = ids[k];
    if (found.names.empty())
      throw InvalidUsage(
          fmt::format("--gpus {}: this machine shows no CUDA device{}: {}; train on the CPU without "
                      "--gpus, with --backend gloo or --backend ucx",
                      r, scope, found.problem));
    if (id >= static_cast<long>(found.names.size())) {
      std::string list;
      for (size_t i = 0; i < found.names.size(); ++i) list += fmt::format("{}{}: {}", i ? ", " : "", i, found.names[i]);
      throw InvalidUsage(fmt::format("--gpus {}: this machine shows {} CUDA device{}{}: {}", r, found.names.size(),
                                     found.names.size() == 1 ? "" : "s", scope, list));
    }
  }
}

}  // namespace dtrain::launch
