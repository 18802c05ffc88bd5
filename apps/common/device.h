#pragma once
// Where a worker trains: the [train] device keys (autocast, whose libtorch
// API differs between Debian's CPU libtorch 1.13 and a CUDA libtorch 2.x, is
// guarded in dtrain/fleet/amp.h).
//
//   [train] device = "auto"          "auto": the launcher's device (dtrain --gpus:
//                                    DTRAIN_DEVICE / FLAGS_selected_gpus) if it gave
//                                    one, else the CPU; "cpu"; "cuda" (that device,
//                                    else cuda:0); "cuda:N"
//           bf16 = false             forward under bf16 autocast (CUDA; on the CPU
//                                    oneDNN's bf16 kernels, fast where the CPU has
//                                    AVX512-BF16 or AMX, emulated and slower elsewhere)
//           channels_last = false    batches and the model's 4-D weights in
//                                    channels-last layout (oneDNN's and cuDNN's
//                                    fast convolution layout)

#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "dtrain/config.h"
#include "dtrain/fleet/amp.h"

namespace dtrain::apps {

// A worker's intra-op threads ([train] threads): libtorch's pool and, where
// libtorch runs its matrix products on OpenBLAS's pthreads build (Debian's),
// OpenBLAS's own pool, which torch::set_num_threads leaves at one thread per
// core: between calls those threads spin in sched_yield, and with several
// workers on a host they take the cores from the other processes (the CTR
// job lost a third of its throughput to them).
inline void set_worker_threads(int n) {
  ::torch::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
}

struct DeviceChoice {
  ::torch::Device device = ::torch::kCPU;
  bool bf16 = false;
  bool channels_last = false;
  std::string source;  // why this device: "train.device", "DTRAIN_DEVICE=1", ...
  std::string note;    // a setting not taken, and why (for the start-up line)
  bool cuda() const { return device.is_cuda(); }
};

// The launcher's device for this worker, or -1.
inline int launcher_device(std::string* from) {
  for (const char* name : {"DTRAIN_DEVICE", "FLAGS_selected_gpus"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    std::string s(v);
    if (s.rfind("cuda:", 0) == 0) s = s.substr(5);
    s = s.substr(0, s.find(','));
    char* end = nullptr;
    long d = std::strtol(s.c_str(), &end, 10);
    if (end != s.c_str() && *end == '\0' && d >= 0) {
      *from = std::string(name) + "=" + v;
      return static_cast<int>(d);
    }
  }
  return -1;
}

// Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16, from
// /proc/cpuinfo); elsewhere oneDNN emulates it, slower than f32.
inline bool cpu_has_bf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0)
      return line.find(" avx512_bf16") != std::string::npos || line.find(" amx_bf16") != std::string::npos;
  return false;
}

// Reads train.device/bf16/channels_last. On a CPU without native bf16,
// train.bf16 is left off (a speed setting, not a numerics request) and `note`
// says so. A CUDA device that libtorch cannot
// use (a CPU-only libtorch, no driver, an index past the last device) is a
// ConfigError at the key, before anything is built. `fail` is config_error.
template <typename Fail>
DeviceChoice choose_device(const Config& cfg, Fail&& fail) {
  DeviceChoice d;
  std::string want = cfg.get_string("train.device");
  std::string from;
  int index = -1;
  if (want == "auto" || want == "cuda") {
    index = launcher_device(&from);
    if (index < 0 && want == "cuda") index = 0;
    if (from.empty()) from = "train.device = \"" + want + "\"";
  } else if (want.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    long n = std::strtol(want.c_str() + 5, &end, 10);
    if (end == want.c_str() + 5 || *end != '\0' || n < 0)
      fail(cfg, "train.device", "\"" + want + "\" is not a device; use \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"");
    index = static_cast<int>(n);
    from = "train.device = \"" + want + "\"";
  } else if (want != "cpu") {
    fail(cfg, "train.device", "\"" + want + "\" is not a device; use \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"");
  }
  d.source = from.empty() ? "train.device = \"" + want + "\"" : from;
  d.bf16 = cfg.get_bool("train.bf16");
  d.channels_last = cfg.get_bool("train.channels_last");
  if (index < 0) {
    if (d.bf16 && !cpu_has_bf16()) {
      d.bf16 = false;
      d.note = "train.bf16 left off: this CPU has neither AVX512-BF16 nor AMX-BF16, the forward runs in f32";
    }
    return d;
  }
  if (!::torch::cuda::is_available())
    fail(cfg, "train.device",
         "wants cuda:" + std::to_string(index) + " (" + d.source +
             ") but no CUDA device is visible to libtorch (a CPU-only libtorch such as Debian's, or no NVIDIA "
             "driver); use train.device = \"cpu\" and --backend gloo or ucx, or build the apps against a CUDA "
             "libtorch (docs/gpu.md)");
  int n = static_cast<int>(::torch::cuda::device_count());
  if (index >= n)
    fail(cfg, "train.device",
         "wants cuda:" + std::to_string(index) + " (" + d.source + ") but libtorch sees " + std::to_string(n) +
             " CUDA device" + (n == 1 ? "" : "s"));
  d.device = ::torch::Device(::torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  return d;
}

// bf16 autocast of the forward pass on `device`'s type for the scope (no-op
// when off): the Fleet API's AutoCast (dtrain/fleet/amp.h).
using AutocastScope = ::dtrain::fleet::AutoCast;

}  // namespace dtrain::apps
