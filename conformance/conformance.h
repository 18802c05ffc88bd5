#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
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
  // -1: the cases' buffers are host memory. N >= 0: they are CUDA buffers on
  // cuda:N (cudaMalloc through the run-time loaded runtime of
  // dtrain/sdk/cuda_runtime.h), filled and checked through host copies
  // against the same expectations; the failure cases stay on host memory.
  int cuda_device = -1;
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

// The reductions' inputs of run() at world size n, checked without a
// transport: for every dtype, reduction op and index, each rank's value, the
// expected result and every partial result of reducing the values in rank
// order, in reverse and pairwise are exact in the dtype (no overflow, no
// rounding), so a correct plugin passes at any world size whatever order it
// reduces in. Returns "" or the first problem.
std::string check_reduction_values(int n);

// Makes a fresh communicator of the same ranks, named name, whose ops time
// out after timeout. Every rank calls it alike, in the same order.
using CommFactory =
    std::function<std::shared_ptr<Communicator>(const std::string& name, std::chrono::milliseconds timeout)>;

// The failure cases, each on a fresh communicator from make_comm while comm
// (healthy) keeps the ranks in step: an all-reduce that only rank 0 joins
// fails there with TimeoutError near its deadline and poisons that
// communicator; a recv nobody sends, aborted from another thread, fails its
// waiter with AbortedError at once. Skipped at world size 1.
Result run_failures(Communicator& comm, const CommFactory& make_comm, const Options& options);

}  // namespace dtrain::conformance
