#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "dtrain/buffer.h"
#include "dtrain/error.h"

// The one place that knows whether this libtorch has CUDA: the current
// stream of a CUDA libtorch (a PyTorch wheel's) orders the backend's op after
// the kernels that produced a tensor. Debian's CPU libtorch ships the c10/cuda
// headers without the library, hence DTRAIN_FLEET_CUDA (fleet/CMakeLists.txt:
// set when libtorch has c10_cuda) beside __has_include.
#if defined(DTRAIN_FLEET_CUDA) && __has_include(<c10/cuda/CUDAStream.h>)
#include <c10/cuda/CUDAStream.h>
#define DTRAIN_HAVE_CUDA_STREAMS 1
#endif

namespace dtrain::fleet::detail {

inline void* current_stream(const ::torch::Device& d) {
#ifdef DTRAIN_HAVE_CUDA_STREAMS
  return c10::cuda::getCurrentCUDAStream(d.index()).stream();
#else
  (void)d;
  return nullptr;  // the legacy default stream (no CUDA tensors exist in a CPU libtorch anyway)
#endif
}

// A dense tensor as a Buffer on its own device (f32, f64, i64 ...), for CUDA
// tensors with the current stream. The tensor must stay alive while the
// Buffer is in use.
inline Buffer device_view(const ::torch::Tensor& t) {
  DType dt;
  switch (t.scalar_type()) {
    case ::torch::kFloat32: dt = DType::F32; break;
    case ::torch::kFloat64: dt = DType::F64; break;
    case ::torch::kInt64: dt = DType::I64; break;
    case ::torch::kInt32: dt = DType::I32; break;
    case ::torch::kInt8: dt = DType::I8; break;
    case ::torch::kUInt8: dt = DType::U8; break;
    case ::torch::kFloat16: dt = DType::F16; break;
    case ::torch::kBFloat16: dt = DType::BF16; break;
    default: throw NotSupported(std::string("a ") + c10::toString(t.scalar_type()) + " tensor cannot be communicated");
  }
  if (t.is_cuda())
    return Buffer(t.data_ptr(), static_cast<size_t>(t.numel()), dt, Device::cuda(t.device().index()),
                  current_stream(t.device()));
  return Buffer(t.data_ptr(), static_cast<size_t>(t.numel()), dt);
}

// A tensor's elements [from, from + len) in logical order, clipped to its
// numel (a rank's slice under ZeRO sharding).
inline int64_t clipped(int64_t numel, int64_t from, int64_t len) {
  return std::max<int64_t>(0, std::min(len, numel - from));
}

// A float32 CPU tensor's memory as a host Buffer.
inline Buffer f32_view(const ::torch::Tensor& t) {
  return Buffer(t.data_ptr<float>(), static_cast<size_t>(t.numel()), DType::F32);
}

}  // namespace dtrain::fleet::detail
