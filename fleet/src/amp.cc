#include "dtrain/fleet/amp.h"

namespace dtrain::fleet {

std::string autocast_unsupported(const ::torch::Device& device, at::ScalarType dtype) {
  if (device.is_cuda() || dtype == at::kBFloat16) return "";
#if TORCH_VERSION_MAJOR >= 2
  return "";
#else
  return std::string("libtorch ") + TORCH_VERSION +
         " autocasts to float16 on CUDA only (its CPU autocast has "
         "bfloat16 only); use amp_configs.dtype = \"bfloat16\" on the CPU";
#endif
}

}  // namespace dtrain::fleet
