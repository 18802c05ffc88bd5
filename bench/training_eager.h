#pragma once
// dtrain-bench training --device: bench/eager_reference.py, the plain PyTorch
// eager loop under the machine's own python and torch, as the reference row.
// Each call starts a process and waits for it (the calling thread blocks).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "training_result.h"

namespace dtrain::bench {

// What every row trains, from the job file: the model, the batch of fixed
// random images of the dataset's shape, and SGD with momentum.
// The job file's values (their defaults are the schema's, apps/cls and apps/common).
struct Workload {
  std::string model;
  double width = 0;
  int channels = 1, size = 28, classes = 10;  // fashion-mnist's; a list data set's from [data]
  int64_t batch = 0;
  double lr = 0, momentum = 0, weight_decay = 0;
  int64_t seed = 0;
};

struct EagerPython {
  std::string python, script;                // the interpreter's path, the script's
  std::vector<std::string> args;             // the workload, as the script's options
  std::map<std::string, std::string> probe;  // EAGER-PROBE's keys: params, torch, torch_file, python, device
};

// Finds the interpreter and asks it (EAGER-PROBE) what its torch is and how
// many parameters the model has: it must import torch and, on CUDA, see the
// device. Throws, naming the python, its error and --python, where it cannot.
EagerPython eager_python(const std::string& python, const Workload& w, const std::string& device, bool bf16,
                         bool channels_last);
// One timed run of the script (a fresh process, as each dtrain row is).
Result run_eager_python(const EagerPython& e, int steps, int warmup);

}  // namespace dtrain::bench
