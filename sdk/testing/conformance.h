#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "dtrain/communicator.h"

namespace dtrain::conformance {

struct Options {
  // The "large" count of every case (at least 4M elements; odd on purpose so
  // that chunking and tails are exercised).
  size_t large_count = 4194319;
  // Only cases whose name contains this substring run ("" = all).
  std::string filter;
  // Print every case as it passes, not only failures.
  bool verbose = false;
};

struct Result {
  int passed = 0;
  int failed = 0;
  int skipped = 0;
  std::vector<std::string> failures;  // "allreduce/f16/sum/n=1001: element 17 is 3, expected 4"
};

// Runs the whole suite on this rank's communicator: every op x dtype x reduction
// op, with counts 0, 1, an odd count and the large count, each result checked
// element by element against values computed independently here. Every rank of
// the communicator must call it with the same options, concurrently. Ops the
// backend leaves out of its capability bits are skipped and counted.
Result run(Communicator& comm, const Options& options);

}  // namespace dtrain::conformance
