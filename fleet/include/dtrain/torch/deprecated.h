#pragma once
// Deprecated for one release: the Fleet API was dtrain::torch under
// dtrain/torch/ until round 3. Include dtrain/fleet/... and write dtrain::fleet.
// Inside namespace dtrain the old name shadows libtorch's `torch`.
#ifndef DTRAIN_NO_DEPRECATION_WARNING
#warning \
    "dtrain/torch/ is deprecated: include dtrain/fleet/ and use dtrain::fleet (define DTRAIN_NO_DEPRECATION_WARNING to silence)"
#endif

namespace dtrain {
namespace fleet {}
namespace torch = fleet;
}  // namespace dtrain
