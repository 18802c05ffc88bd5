#pragma once
// The CUDA runtime, loaded at run time: the few entry points a CPU backend
// (host staging, cuda_staging.h) or a test needs, found with dlopen in
// libcudart.so.13, .12, .11.0 or libcudart.so (or the one DTRAIN_CUDART names:
// a path or soname), never a link dependency. A plugin that uses it keeps loading and working on machines without CUDA;
// only an op on a CUDA buffer there fails, with an error naming the device.
// Header-only, standard C++17 and <dlfcn.h>; no CUDA header is needed.
//
// Thread-safety: runtime() loads once (first caller) and is then read-only.

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "dtrain/sdk/error.h"

namespace dtrain::sdk::cuda {

// Values of the CUDA runtime's ABI (stable across 11.x-13.x).
constexpr int kSuccess = 0;
constexpr int kErrorNotReady = 600;
constexpr int kMemcpyHostToDevice = 1;
constexpr int kMemcpyDeviceToHost = 2;
constexpr unsigned kHostAllocPortable = 1;
constexpr unsigned kEventDisableTiming = 2;

struct Runtime {
  using Status = int;
  Status (*GetDeviceCount)(int*) = nullptr;
  const char* (*GetErrorString)(Status) = nullptr;
  Status (*GetLastError)() = nullptr;
  Status (*RuntimeGetVersion)(int*) = nullptr;
  Status (*GetDevice)(int*) = nullptr;
  Status (*SetDevice)(int) = nullptr;
  Status (*Malloc)(void**, size_t) = nullptr;
  Status (*Free)(void*) = nullptr;
  Status (*HostAlloc)(void**, size_t, unsigned) = nullptr;
  Status (*FreeHost)(void*) = nullptr;
  Status (*Memcpy)(void*, const void*, size_t, int) = nullptr;
  Status (*MemcpyAsync)(void*, const void*, size_t, int, void*) = nullptr;
  Status (*StreamSynchronize)(void*) = nullptr;
  Status (*EventCreateWithFlags)(void**, unsigned) = nullptr;
  Status (*EventRecord)(void*, void*) = nullptr;
  Status (*EventQuery)(void*) = nullptr;
  Status (*EventSynchronize)(void*) = nullptr;
  Status (*EventDestroy)(void*) = nullptr;

  std::string library;  // the file that was loaded ("" if none)
  int version = 0;      // cudaRuntimeGetVersion, e.g. 13000
  int devices = 0;      // visible devices; 0 when unusable
  // Why no device can be used ("" when devices > 0): no runtime library,
  // a missing entry point, or cudaGetDeviceCount's error (no driver).
  std::string error;

  bool usable() const { return devices > 0; }
  std::string describe(Status st) const {
    const char* s = GetErrorString ? GetErrorString(st) : nullptr;
    return std::string(s ? s : "unknown CUDA error") + " (" + std::to_string(st) + ")";
  }
  // Throws sdk::Error(DT_ERR_SYSTEM) naming what failed, unless st is success.
  void check(Status st, const std::string& what) const {
    if (st == kSuccess) return;
    if (GetLastError) GetLastError();  // clear it, so the next call is not blamed
    fail(DT_ERR_SYSTEM, "CUDA: " + what + " failed: " + describe(st));
  }
};

namespace detail {

inline Runtime load_runtime() {
  Runtime rt;
  static const char* kNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
  void* h = nullptr;
  std::string tried;
  if (const char* e = std::getenv("DTRAIN_CUDART"); e && *e) {
    // The library the user named, and no other.
    if ((h = dlopen(e, RTLD_NOW | RTLD_LOCAL))) {
      rt.library = e;
    } else {
      const char* err = dlerror();
      tried = "DTRAIN_CUDART=" + std::string(e) + ": " + (err ? err : "cannot be loaded");
    }
  } else {
    // A runtime the process already has (a CUDA libtorch's) first: one
    // runtime per process, so streams and pointers mean the same to both.
    for (const char* n : kNames)
      if ((h = dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD))) {
        rt.library = n;
        break;
      }
    for (size_t i = 0; !h && i < sizeof(kNames) / sizeof(kNames[0]); ++i) {
      if ((h = dlopen(kNames[i], RTLD_NOW | RTLD_LOCAL))) {
        rt.library = kNames[i];
        break;
      }
      const char* e = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (e ? e : kNames[i]);
    }
  }
  if (!h) {
    rt.error = "no CUDA runtime library could be loaded (" + tried + ")";
    return rt;
  }
  bool missing = false;
  auto sym = [&](auto& fn, const char* name) {
    void* p = dlsym(h, name);
    if (!p) {
      if (!missing) rt.error = rt.library + " has no " + name;
      missing = true;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  sym(rt.GetDeviceCount, "cudaGetDeviceCount");
  sym(rt.GetErrorString, "cudaGetErrorString");
  sym(rt.GetLastError, "cudaGetLastError");
  sym(rt.RuntimeGetVersion, "cudaRuntimeGetVersion");
  sym(rt.GetDevice, "cudaGetDevice");
  sym(rt.SetDevice, "cudaSetDevice");
  sym(rt.Malloc, "cudaMalloc");
  sym(rt.Free, "cudaFree");
  sym(rt.HostAlloc, "cudaHostAlloc");
  sym(rt.FreeHost, "cudaFreeHost");
  sym(rt.Memcpy, "cudaMemcpy");
  sym(rt.MemcpyAsync, "cudaMemcpyAsync");
  sym(rt.StreamSynchronize, "cudaStreamSynchronize");
  sym(rt.EventCreateWithFlags, "cudaEventCreateWithFlags");
  sym(rt.EventRecord, "cudaEventRecord");
  sym(rt.EventQuery, "cudaEventQuery");
  sym(rt.EventSynchronize, "cudaEventSynchronize");
  sym(rt.EventDestroy, "cudaEventDestroy");
  if (missing) return rt;  // the library stays loaded: harmless, and symbols may be shared
  if (rt.RuntimeGetVersion(&rt.version) != kSuccess) rt.version = 0;
  int n = 0;  // cudaGetDeviceCount leaves it unwritten when it fails (no driver)
  Runtime::Status st = rt.GetDeviceCount(&n);
  rt.GetLastError();
  if (st != kSuccess) {
    rt.error = "cudaGetDeviceCount: " + rt.describe(st);
  } else if (n <= 0) {
    rt.error = "cudaGetDeviceCount: 0 devices";
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"))
      rt.error += ", CUDA_VISIBLE_DEVICES='" + std::string(v) + "'";
  } else {
    rt.devices = n;
  }
  return rt;
}

}  // namespace detail

// The process's CUDA runtime, loaded on first use.
inline const Runtime& runtime() {
  static const Runtime rt = detail::load_runtime();
  return rt;
}

// The runtime, if cuda:device can be used; else throws
// sdk::Error(DT_ERR_NOT_SUPPORTED): "buffer on cuda:0 but no CUDA device is
// visible: cudaGetDeviceCount: CUDA driver version is insufficient ...".
inline const Runtime& require_device(int device) {
  const Runtime& rt = runtime();
  std::string where = "buffer on cuda:" + std::to_string(device);
  if (!rt.usable()) fail(DT_ERR_NOT_SUPPORTED, where + " but no CUDA device is visible: " + rt.error);
  if (device < 0 || device >= rt.devices)
    fail(DT_ERR_INVALID_USAGE, where + " but only " + std::to_string(rt.devices) + " CUDA device" +
                                   (rt.devices == 1 ? " is" : "s are") +
                                   " visible (cuda:0..cuda:" + std::to_string(rt.devices - 1) + ")");
  return rt;
}

// Makes device current for the scope and restores the previous one.
class DeviceGuard {
 public:
  DeviceGuard(const Runtime& rt, int device) : rt_(rt) {
    rt_.check(rt_.GetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device)
      rt_.check(rt_.SetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
    else
      prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) rt_.SetDevice(prev_);  // best effort: a destructor cannot report
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const Runtime& rt_;
  int prev_ = -1;
};

}  // namespace dtrain::sdk::cuda
