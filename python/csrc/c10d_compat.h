#pragma once
// The one place where dtrain's c10d backend differs between torch releases.
//
// torch 1.13 (Debian's python3-torch) registers a third-party backend as a
// c10d::ProcessGroup subclass; torch 2.x as a c10d::Backend subclass (2.x's
// ProcessGroup dispatches to one Backend per device type). 1.13 ships
// Backend.hpp but cannot register one, so the base is chosen on
// TORCH_VERSION_MAJOR, as intel/torch-ccl does.

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace dtrain::python {

#if TORCH_VERSION_MAJOR >= 2
using C10dBase = c10d::Backend;
#else
using C10dBase = c10d::ProcessGroup;
#endif

// "1.13", "2.11": what the extension was compiled against (checked at import).
inline const char* built_torch_version() {
  return C10_STRINGIZE(TORCH_VERSION_MAJOR) "." C10_STRINGIZE(TORCH_VERSION_MINOR);
}

}  // namespace dtrain::python
