#pragma once
// Debian's libtorch-dev 1.13 ships c10d/reducer.hpp but not the distributed
// autograd headers it includes. reducer.hpp needs only these two names; the
// Reducer's layout is unaffected (ContextPtr is a shared_ptr whatever it points to).
#include <functional>
#include <memory>

#include <ATen/Tensor.h>

namespace torch::distributed::autograd {
class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;
}  // namespace torch::distributed::autograd
