// The conformance suite's reduction inputs at any world size (conformance/conformance.h):
// exact in every dtype, whatever order a plugin reduces in, without running a transport.
#include <gtest/gtest.h>

#include "conformance.h"

TEST(ConformanceValues, ExactAtEveryWorldSizeUpTo64) {
  for (int n = 1; n <= 64; ++n) EXPECT_EQ(dtrain::conformance::check_reduction_values(n), "") << "world size " << n;
}

TEST(ConformanceValues, ExactAtLargeWorldSizes) {
  for (int n : {121, 122, 242, 1000, 4096}) EXPECT_EQ(dtrain::conformance::check_reduction_values(n), "");
}
