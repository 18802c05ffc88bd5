// DataParallel's CUDA path (gradient buckets as device tensors, broadcasts
// tensor by tensor, f16/bf16 compression with fp16_allreduce) run on CPU
// tensors through gloo: DTRAIN_TORCH_DEVICE_BUCKETS=1 routes CPU parameters
// through it, so its logic is tested on a machine without a GPU. Two ranks as
// threads; the reference is the exact average of both ranks' gradients, and
// the CPU path (the core's GradientBuckets) on the same inputs.
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/strategy.h"
#include "dtrain/fleet/data_parallel.h"
#include "rank_threads.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace data_parallel_device_test {

using namespace std::chrono;

namespace {

constexpr int kWorld = 2;

// Three layers (six parameters); rank r's weights differ, so the initial
// broadcast (rank 0's weights everywhere) shows.
std::shared_ptr<::torch::nn::Sequential> make_net(int rank) {
  auto net = std::make_shared<::torch::nn::Sequential>(::torch::nn::Linear(16, 40), ::torch::nn::Tanh(),
                                                       ::torch::nn::Linear(40, 24), ::torch::nn::Tanh(),
                                                       ::torch::nn::Linear(24, 5));
  ::torch::NoGradGuard ng;
  int k = 0;
  for (auto& p : (*net)->parameters()) {
    auto n = p.numel();
    p.copy_(::torch::sin(::torch::arange(n, ::torch::kFloat32) * 0.37 + k++).reshape(p.sizes()) * 0.3 + rank);
  }
  return net;
}

::torch::Tensor input_of(int rank) {
  return ::torch::cos(::torch::arange(8 * 16, ::torch::kFloat32) * (0.11 + 0.05 * rank)).reshape({8, 16});
}

::torch::Tensor loss_of(::torch::nn::Sequential& net, int rank) {
  return net->forward(input_of(rank)).pow(2).sum() * (rank + 1);
}

struct Outcome {
  std::vector<::torch::Tensor> grads, weights;
  double bytes_on_wire = 0;
  // Gradients as views of a larger tensor: the device path's buckets (the CPU
  // path's are host blocks, one from_blob per gradient).
  bool bucket_views = false;
};

// Runs one step on both ranks with the given options and path.
std::vector<Outcome> run_step(const dtrain::StrategyOptions& so, bool device_path) {
  if (device_path)
    setenv("DTRAIN_TORCH_DEVICE_BUCKETS", "1", 1);
  else
    unsetenv("DTRAIN_TORCH_DEVICE_BUCKETS");
  std::vector<Outcome> out(kWorld);
  dtrain::test::run_rank_threads("gloo", kWorld, seconds(60),
                                 [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
                                   auto net = make_net(r);
                                   dtrain::fleet::DataParallel dp(net->ptr(), comm, so);
                                   dp.begin_step(0);
                                   loss_of(*net, r).backward();
                                   dp.end_backward(0);
                                   for (auto& p : (*net)->parameters()) {
                                     const auto& g = p.grad();
                                     if (g.storage().nbytes() > static_cast<size_t>(g.numel()) * sizeof(float))
                                       out[r].bucket_views = true;
                                     out[r].grads.push_back(g.clone());
                                     out[r].weights.push_back(p.detach().clone());
                                   }
                                   out[r].bytes_on_wire = dp.stats().bytes_on_wire;
                                 });
  unsetenv("DTRAIN_TORCH_DEVICE_BUCKETS");
  return out;
}

// The exact average of both ranks' gradients, from rank 0's weights: make()
// builds rank 0's net, loss(net, r) is rank r's loss.
template <typename Make, typename Loss>
std::vector<::torch::Tensor> average_of_ranks(Make make, Loss loss) {
  std::vector<::torch::Tensor> avg;
  for (int r = 0; r < kWorld; ++r) {
    auto net = make();
    loss(*net, r).backward();
    auto params = (*net)->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto g = params[i].grad() / kWorld;
      if (r == 0)
        avg.push_back(g);
      else
        avg[i] += g;
    }
  }
  return avg;
}

std::vector<::torch::Tensor> expected_grads() {
  return average_of_ranks([] { return make_net(0); }, [](auto& net, int r) { return loss_of(net, r); });
}

int64_t numel_all() {
  int64_t n = 0;
  for (auto& p : (*make_net(0))->parameters()) n += p.numel();
  return n;
}

void expect_close(const std::vector<::torch::Tensor>& got, const std::vector<::torch::Tensor>& want, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    double scale = want[i].abs().max().item<double>();
    double err = (got[i] - want[i]).abs().max().item<double>();
    EXPECT_LE(err, rtol * scale) << what << ": parameter " << i << " max error " << err << " of max " << scale;
  }
}

class DeviceBuckets : public ::testing::TestWithParam<std::string> {};  // "f32", "f16", "bf16"

}  // namespace

TEST_P(DeviceBuckets, AverageGradientsAsTheCpuPathDoes) {
  dtrain::StrategyOptions so;
  so.fuse_grad_size_in_MB = 2048.0 / (1 << 20);  // 2 KiB buckets: several per step
  so.fp16_allreduce = GetParam() != "f32";
  so.wire_dtype = GetParam() == "bf16" ? dtrain::DType::BF16 : dtrain::DType::F16;
  const double rtol = GetParam() == "f32" ? 1e-6 : GetParam() == "f16" ? 2e-3 : 2e-2;
  auto want = expected_grads();
  auto device = run_step(so, true);
  auto cpu = run_step(so, false);
  auto rank0 = make_net(0);
  std::vector<::torch::Tensor> w0;
  for (auto& p : (*rank0)->parameters()) w0.push_back(p.detach());
  const double bytes = static_cast<double>(numel_all()) * (so.fp16_allreduce ? 2 : 4);
  for (int r = 0; r < kWorld; ++r) {
    std::string at = GetParam() + " rank " + std::to_string(r);
    EXPECT_TRUE(device[r].bucket_views) << "DTRAIN_TORCH_DEVICE_BUCKETS=1 did not take the device path, " << at;
    EXPECT_FALSE(cpu[r].bucket_views) << at;
    expect_close(device[r].weights, w0, 0, "device path: initial broadcast, " + at);
    expect_close(device[r].grads, want, rtol, "device path: gradients, " + at);
    expect_close(cpu[r].grads, want, rtol, "CPU path: gradients, " + at);
    // The two paths: the same buckets, the same conversion and the same sum.
    expect_close(device[r].grads, cpu[r].grads, GetParam() == "f32" ? 1e-6 : rtol / 2, "device vs CPU path, " + at);
    EXPECT_EQ(device[r].bytes_on_wire, bytes) << at;
    EXPECT_EQ(cpu[r].bytes_on_wire, bytes) << at;
  }
  // The 16-bit sum is not the exact one: the wire really was 16-bit.
  if (so.fp16_allreduce) {
    double err = 0;
    for (size_t i = 0; i < want.size(); ++i) err += (device[0].grads[i] - want[i]).abs().sum().item<double>();
    EXPECT_GT(err, 0) << "the gradients came back exact: no 16-bit wire";
  }
}

INSTANTIATE_TEST_SUITE_P(Wire, DeviceBuckets, ::testing::Values("f32", "f16", "bf16"),
                         [](const auto& info) { return info.param; });

namespace {

// A small conv net; rank r's weights differ (the broadcast shows).
std::shared_ptr<::torch::nn::Sequential> make_conv_net(int rank, bool channels_last) {
  auto net = std::make_shared<::torch::nn::Sequential>(
      ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(3, 6, 3).padding(1)), ::torch::nn::Tanh(),
      ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(6, 4, 3).padding(1)));
  ::torch::NoGradGuard ng;
  int k = 0;
  for (auto& p : (*net)->parameters()) {
    auto n = p.numel();
    p.copy_(::torch::sin(::torch::arange(n, ::torch::kFloat32) * 0.29 + k++).reshape(p.sizes()) * 0.3 + 0.1 * rank);
    if (channels_last && p.dim() == 4) p.set_data(p.contiguous(::torch::MemoryFormat::ChannelsLast));
  }
  return net;
}

::torch::Tensor conv_loss(::torch::nn::Sequential& net, int rank, bool channels_last) {
  auto x = ::torch::cos(::torch::arange(2 * 3 * 8 * 8, ::torch::kFloat32) * (0.07 + 0.03 * rank)).reshape({2, 3, 8, 8});
  if (channels_last) x = x.contiguous(::torch::MemoryFormat::ChannelsLast);
  return net->forward(x).pow(2).sum() * (rank + 1);
}

// Two steps; before the second the gradients are zeroed in place or, as
// libtorch 2.x's zero_grad() does by default, dropped (set_to_none).
std::vector<std::vector<::torch::Tensor>> conv_steps(bool device_path, bool channels_last, bool drop_grads) {
  if (device_path)
    setenv("DTRAIN_TORCH_DEVICE_BUCKETS", "1", 1);
  else
    unsetenv("DTRAIN_TORCH_DEVICE_BUCKETS");
  dtrain::StrategyOptions so;
  so.fuse_grad_size_in_MB = 512.0 / (1 << 20);
  std::vector<std::vector<::torch::Tensor>> grads(kWorld);
  dtrain::test::run_rank_threads("gloo", kWorld, seconds(60),
                                 [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
                                   auto net = make_conv_net(r, channels_last);
                                   dtrain::fleet::DataParallel dp(net->ptr(), comm, so);
                                   for (int64_t step = 0; step < 2; ++step) {
                                     if (step == 1)
                                       for (auto& p : (*net)->parameters()) {
                                         if (drop_grads)
                                           p.mutable_grad() = ::torch::Tensor();
                                         else
                                           p.mutable_grad().zero_();
                                       }
                                     dp.begin_step(step);
                                     conv_loss(*net, r, channels_last).backward();
                                     dp.end_backward(step);
                                   }
                                   for (auto& p : (*net)->parameters()) {
                                     ASSERT_TRUE(p.grad().defined());
                                     grads[r].push_back(p.grad().clone(::torch::MemoryFormat::Contiguous));
                                   }
                                 });
  unsetenv("DTRAIN_TORCH_DEVICE_BUCKETS");
  return grads;
}

std::vector<::torch::Tensor> expected_conv_grads() {
  return average_of_ranks([] { return make_conv_net(0, false); },
                          [](auto& net, int r) { return conv_loss(net, r, false); });
}

}  // namespace

// Channels-last weights (oneDNN's and cuDNN's fast layout) are averaged like
// contiguous ones on both paths, and a gradient the optimizer dropped between
// steps (libtorch 2.x's zero_grad() sets it to none) is averaged too.
TEST(DataParallelLayouts, ChannelsLastAndDroppedGradientsAreAveraged) {
  auto want = expected_conv_grads();
  for (bool device_path : {false, true})
    for (bool channels_last : {false, true})
      for (bool drop : {false, true}) {
        auto got = conv_steps(device_path, channels_last, drop);
        for (int r = 0; r < kWorld; ++r)
          expect_close(got[r], want, 1e-5,
                       std::string(device_path ? "device" : "CPU") + " path, " +
                           (channels_last ? "channels-last" : "contiguous") + (drop ? ", gradients dropped" : "") +
                           ", rank " + std::to_string(r));
      }
}

}  // namespace data_parallel_device_test
