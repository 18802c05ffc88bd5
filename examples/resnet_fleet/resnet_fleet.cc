// The collective quick start of Paddle's Fleet, in C++ on dtrain::fleet: a
// small ResNet on Fashion-MNIST, data-parallel over every worker.
//
//   dtrain --nproc_per_node 2 -- ./resnet_fleet [--batches 40] [--epochs 1]
//   mpirun -np 2 ./resnet_fleet
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./resnet_fleet & (and RANK=1 ...)
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <dtrain/fleet/fleet.h>
#include <torch/torch.h>

namespace fleet = dtrain::fleet;

// Fashion-MNIST's gzip IDX files: images [N,1,28,28] scaled to [0,1], labels [N].
torch::Tensor read_idx(const std::string& path, int64_t limit) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  unsigned char h[16];
  int dims = 0;
  gzread(f, h, 4);
  dims = h[3];
  std::vector<int64_t> shape;
  for (int d = 0; d < dims; ++d) {
    gzread(f, h, 4);
    shape.push_back((int64_t(h[0]) << 24) | (h[1] << 16) | (h[2] << 8) | h[3]);
  }
  shape[0] = std::min(shape[0], limit);
  auto t = torch::empty(shape, torch::kUInt8);
  int64_t bytes = t.numel();
  if (gzread(f, t.data_ptr<uint8_t>(), unsigned(bytes)) != bytes) throw std::runtime_error("short read in " + path);
  gzclose(f);
  return t;
}

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t in, int64_t out, int64_t stride)
      : c1(register_module(
            "c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        b1(register_module("b1", torch::nn::BatchNorm2d(out))),
        c2(register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        b2(register_module("b2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out)
      down =
          register_module("down", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = b2(c2(torch::relu(b1(c1(x)))));
    return torch::relu(y + (down ? down(x) : x));
  }
  torch::nn::Conv2d c1, c2, down{nullptr};
  torch::nn::BatchNorm2d b1, b2;
};
TORCH_MODULE(Block);

struct ResNetImpl : torch::nn::Module {
  ResNetImpl(int64_t width, int64_t classes)
      : stem(register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, width, 3).padding(1).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(width))),
        l1(register_module("l1", Block(width, width, 1))),
        l2(register_module("l2", Block(width, 2 * width, 2))),
        fc(register_module("fc", torch::nn::Linear(2 * width, classes))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = l2(l1(torch::relu(bn(stem(x)))));
    return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d bn;
  Block l1, l2;
  torch::nn::Linear fc;
};
TORCH_MODULE(ResNet);

int main(int argc, char** argv) try {
  int64_t epochs = 1, batches = 40, batch_size = 32;
  std::string data = "/usr/share/datasets/fashion-mnist";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--epochs")
      epochs = std::atoll(argv[i + 1]);
    else if (k == "--batches")
      batches = std::atoll(argv[i + 1]);
    else if (k == "--batch_size")
      batch_size = std::atoll(argv[i + 1]);
    else if (k == "--data")
      data = argv[i + 1];
    else
      throw std::runtime_error("unknown option " + k);
  }
  torch::set_num_threads(1);

  fleet::init(/*is_collective=*/true);
  const int rank = fleet::worker_index(), world = fleet::worker_num();

  torch::manual_seed(rank);  // different on purpose: distributed_model broadcasts rank 0's parameters
  ResNet model(16, 10);
  auto optimizer = fleet::distributed_optimizer(std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4)));
  fleet::distributed_model(model);

  // Each worker reads its own share: batch b of rank r is images [(b*world + r)*B, +B).
  const int64_t n = batches * batch_size * world;
  auto images = read_idx(data + "/train-images-idx3-ubyte.gz", n)
                    .unsqueeze(1)
                    .to(torch::kFloat32)
                    .div_(255)
                    .sub_(0.286)
                    .div_(0.353);
  auto labels = read_idx(data + "/train-labels-idx1-ubyte.gz", n).to(torch::kInt64);

  double correct = 0, seen = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    for (int64_t b = 0; b < batches; ++b) {
      int64_t start = (b * world + rank) * batch_size;
      auto img = images.narrow(0, start, batch_size), label = labels.narrow(0, start, batch_size);
      auto out = model->forward(img);
      auto loss = torch::nn::functional::cross_entropy(out, label);
      auto top5 = std::get<1>(out.topk(5, 1)).eq(label.unsqueeze(1));
      double acc1 = top5.select(1, 0).to(torch::kFloat32).mean().item<double>();
      double acc5 = top5.any(1).to(torch::kFloat32).mean().item<double>();
      if (epoch + 1 == epochs && b + 5 >= batches) correct += acc1 * batch_size, seen += batch_size;
      loss.backward();
      optimizer->step();  // waits for the gradient all-reduces, then steps as the strategy says
      optimizer->zero_grad();
      if (b % 5 == 0)
        std::printf("[Epoch %lld, batch %lld] loss %.5f, acc1 %.5f, acc5 %.5f\n", (long long)epoch, (long long)b,
                    loss.item<double>(), acc1, acc5);
    }
  }
  // The same on every worker: the global accuracy of the last 5 batches, and a hash of the parameters.
  double acc = fleet::metrics::acc(correct, seen);
  uint64_t h = 1469598103934665603ULL;
  for (auto& p : model->parameters()) {
    auto t = p.contiguous();
    auto* c = static_cast<const unsigned char*>(t.data_ptr());
    for (size_t i = 0; i < size_t(t.numel()) * t.element_size(); ++i) h = (h ^ c[i]) * 1099511628211ULL;
  }
  fleet::barrier_worker();
  std::printf("worker %d/%d done: acc1 of the last batches %.4f, params fnv1a64 %016llx\n", rank, world, acc,
              (unsigned long long)h);
  return 0;
} catch (const c10::Error& e) {
  std::fprintf(stderr, "resnet_fleet: error: %s\n", e.what_without_backtrace());
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "resnet_fleet: error: %s\n", e.what());
  return 1;
}
