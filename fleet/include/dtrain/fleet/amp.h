#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <string>

#include "dtrain/strategy.h"

// Automatic mixed precision for the Fleet API (Paddle's amp strategy,
// paddle.amp.auto_cast and GradScaler; PyTorch's autocast and GradScaler).
//
//   [strategy] amp = true
//   [strategy.amp_configs] dtype = "bfloat16"     or "float16" (loss scaling)
//
//   const auto& s = dtrain::fleet::strategy();
//   torch::Tensor loss;
//   { dtrain::fleet::AutoCast ac(s.amp, device, dtrain::fleet::amp_dtype(s));
//     loss = criterion(model->forward(x), y); }
//   opt->scale(loss).backward();          // * the loss scale with float16, else the loss
//   opt->step();                          // unscales, skips the step on inf/NaN on any rank
//
// The loss scaling itself is in DistributedOptimizer (optimizer.h) and the
// core's LossScaler (dtrain/strategy.h). This header is the one place that
// knows the two autocast APIs of Debian's CPU libtorch 1.13 and a CUDA
// libtorch 2.x. libtorch 1.13's CPU autocast has bfloat16 only
// (autocast_unsupported says so).
namespace dtrain::fleet {

// Autocast of the forward pass in `dtype` on `device`'s type for the scope
// (no-op when off). Losses autocast keeps in f32 (cross_entropy) stay f32; a
// loss computed by hand (softmax, Dice) should cast the logits to f32 first.
class AutoCast {
 public:
  AutoCast(bool on, const ::torch::Device& device, at::ScalarType dtype = at::kBFloat16)
      : on_(on), cuda_(device.is_cuda()) {
    if (!on_) return;
    prev_enabled_ = enabled();
    prev_dtype_ = this->dtype();
    set(true, dtype);
    at::autocast::increment_nesting();
  }
  ~AutoCast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(prev_enabled_, prev_dtype_);
  }
  AutoCast(const AutoCast&) = delete;
  AutoCast& operator=(const AutoCast&) = delete;

 private:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::DeviceType type() const { return cuda_ ? at::kCUDA : at::kCPU; }
  bool enabled() const { return at::autocast::is_autocast_enabled(type()); }
  at::ScalarType dtype() const { return at::autocast::get_autocast_dtype(type()); }
  void set(bool on, at::ScalarType t) const {
    at::autocast::set_autocast_enabled(type(), on);
    at::autocast::set_autocast_dtype(type(), t);
  }
#else
  bool enabled() const { return cuda_ ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled(); }
  at::ScalarType dtype() const {
    return cuda_ ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
  }
  void set(bool on, at::ScalarType t) const {
    if (cuda_) {
      at::autocast::set_enabled(on);
      at::autocast::set_autocast_gpu_dtype(t);
    } else {
      at::autocast::set_cpu_enabled(on);
      at::autocast::set_autocast_cpu_dtype(t);
    }
  }
#endif
  bool on_, cuda_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

// The autocast type amp_configs.dtype names.
inline at::ScalarType amp_dtype(const StrategyOptions& s) {
  return s.amp_dtype == DType::BF16 ? at::kBFloat16 : at::kHalf;
}

// Whether this libtorch can autocast to `dtype` on `device` ("" if so, else
// why not): CPU autocast before libtorch 2.x has bfloat16 only.
std::string autocast_unsupported(const ::torch::Device& device, at::ScalarType dtype);

}  // namespace dtrain::fleet
