// dtrain-gpu-smoke: data-parallel training of a small conv net on the
// worker's GPU through the Fleet API (DataParallel's CUDA gradient buckets,
// handed to the backend as CUDA buffers). Every worker prints its loss and a
// hash of its parameters; the workers of a job must print the same hash.
//
//   dtrain --gpus 0 --backend nccl -- dtrain-gpu-smoke
//   dtrain --nproc_per_node 2 --backend gloo -- dtrain-gpu-smoke   (both on cuda:0, staged)
//   dtrain-gpu-smoke --fp16-allreduce f16|bf16   gradients travel as 16-bit floats
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <torch/torch.h>

#include "dtrain/fleet/fleet.h"

namespace fleet = dtrain::fleet;

int main(int argc, char** argv) {
  try {
    fleet::InitOptions io;
    if (argc == 3 && std::strcmp(argv[1], "--fp16-allreduce") == 0) {
      dtrain::StrategyOptions s;
      s.fp16_allreduce = true;
      s.wire_dtype = dtrain::parse_dtype(argv[2]);
      io.strategy = s;
    } else if (argc != 1) {
      std::fprintf(stderr, "usage: dtrain-gpu-smoke [--fp16-allreduce f16|bf16]\n");
      return 2;
    }
    fleet::init(io);
    if (!torch::cuda::is_available()) {
      std::fprintf(stderr, "dtrain-gpu-smoke: no CUDA device is visible to libtorch\n");
      return 77;
    }
    const char* d = std::getenv("DTRAIN_DEVICE");
    int dev = d && *d ? std::atoi(std::strchr(d, ':') ? std::strchr(d, ':') + 1 : d) : 0;
    torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(dev));
    torch::manual_seed(1);
    auto net =
        torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU(),
                              torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten(), torch::nn::Linear(16, 10));
    net->to(device);
    fleet::distributed_model(net.ptr());
    auto opt = fleet::distributed_optimizer(
        std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)));
    torch::manual_seed(100 + fleet::worker_index());  // each worker its own data
    auto x = torch::randn({64, 3, 16, 16}, device);
    auto y = torch::randint(0, 10, {64}, torch::TensorOptions().dtype(torch::kInt64).device(device));
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
      loss.backward();
      opt->step();
      opt->zero_grad();
      (step == 0 ? first : last) = loss.item<double>();
    }
    uint64_t h = 1469598103934665603ULL;
    for (auto& p : net->parameters()) {
      auto t = p.detach().to(torch::kCPU).contiguous();
      auto* b = static_cast<const unsigned char*>(t.data_ptr());
      for (size_t i = 0; i < static_cast<size_t>(t.numel()) * t.element_size(); ++i) h = (h ^ b[i]) * 1099511628211ULL;
    }
    std::printf("dtrain-gpu-smoke: rank %d/%d on %s, backend %s%s: loss %.4f -> %.4f, params fnv1a64 %016llx\n",
                fleet::worker_index(), fleet::worker_num(), device.str().c_str(),
                fleet::communicator() ? fleet::communicator()->backend_name().c_str() : "none",
                io.strategy ? (std::string(", fp16_allreduce ") + argv[2]).c_str() : "", first, last,
                static_cast<unsigned long long>(h));
    fleet::shutdown();
    return last < first ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-gpu-smoke: %s\n", e.what());
    return 1;
  }
}
