// SyncBatchNorm (dtrain/fleet/sync_batch_norm.h): 2 ranks as threads, each
// with batch B, against one process with the concatenated batch 2B, over
// gloo and ucx (a backend whose plugin does not load is skipped).
//
// The convention is PyTorch's SyncBatchNorm + DDP: each rank's loss is the
// mean over its own samples, so the global loss is the mean of the ranks'
// losses; a rank's input gradient is then 2x (world size) the one-process
// gradient of its slice, and the average of the ranks' parameter gradients
// (what DataParallel computes) is the one-process parameter gradient.
//
// Tolerance: 1e-5 relative + 1e-5 absolute. The statistics are the same sums
// in a different order (per rank, then across ranks, in f64 here; one f32
// pass in libtorch's batch_norm), so f32 results differ in the last bits; an
// error (local instead of global statistics, a missed allreduce in backward,
// biased instead of unbiased running variance) moves values by 1e-2 or more.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/strategy.h"
#include "dtrain/fleet/data_parallel.h"
#include "dtrain/fleet/sync_batch_norm.h"
#include "rank_threads.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace sync_bn_test {

using namespace std::chrono;

namespace {

using ::testing::HasSubstr;
namespace nn = ::torch::nn;
using Tensor = ::torch::Tensor;

constexpr int kWorld = 2;
constexpr int64_t kB = 4, kC = 3, kHW = 5;

bool close(const Tensor& a, const Tensor& b) { return ::torch::allclose(a, b, 1e-5, 1e-5); }

std::string diff(const Tensor& a, const Tensor& b) {
  return "max diff " + std::to_string((a - b).abs().max().item<double>());
}

Tensor input_of(int rank) {
  auto n = kB * kC * kHW * kHW;
  return (::torch::sin(::torch::arange(n, ::torch::kFloat32) * (0.37 + 0.11 * rank)) * (1.5 + rank) + 0.3 * rank)
      .reshape({kB, kC, kHW, kHW});
}

Tensor target_of(int rank) {
  auto n = kB * kC * kHW * kHW;
  return ::torch::cos(::torch::arange(n, ::torch::kFloat32) * (0.23 + 0.07 * rank)).reshape({kB, kC, kHW, kHW});
}

void set_affine(dtrain::fleet::BatchNorm2d& bn) {
  ::torch::NoGradGuard ng;
  bn->weight.copy_(::torch::tensor({0.5f, 1.5f, -0.7f}));
  bn->bias.copy_(::torch::tensor({0.1f, -0.2f, 0.3f}));
}

class SyncBnTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    try {
      dtrain::PluginRegistry().load(GetParam());
    } catch (const dtrain::Error& e) {
      GTEST_SKIP() << "the " << GetParam() << " plugin does not load: " << e.what();
    }
  }
};

struct RankResult {
  Tensor y, grad_x, grad_w, grad_b, running_mean, running_var;
};

// The module alone: forward outputs, running statistics, input, weight and
// bias gradients.
TEST_P(SyncBnTest, sync_bn_TwoRanksEqualOneProcessOnTheConcatenatedBatch) {
  std::vector<RankResult> out(kWorld);
  dtrain::test::run_rank_threads(GetParam(), kWorld, seconds(60),
                                 [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
                                   dtrain::fleet::BatchNorm2d bn(kC);
                                   set_affine(bn);
                                   EXPECT_EQ(dtrain::fleet::enable_sync_batch_norm(*bn, comm), 1);
                                   bn->train();
                                   auto x = input_of(r).requires_grad_(true);
                                   auto y = bn(x);
                                   (y * target_of(r)).mean().backward();
                                   out[r] = {y.detach(),
                                             x.grad(),
                                             bn->weight.grad(),
                                             bn->bias.grad(),
                                             bn->running_mean.clone(),
                                             bn->running_var.clone()};
                                 });
  if (HasFailure()) return;

  dtrain::fleet::BatchNorm2d ref(kC);
  set_affine(ref);
  ref->train();
  auto x = ::torch::cat({input_of(0), input_of(1)}).requires_grad_(true);
  auto y = ref(x);
  (y * ::torch::cat({target_of(0), target_of(1)})).mean().backward();

  for (int r = 0; r < kWorld; ++r) {
    auto slice = [&](const Tensor& t) { return t.slice(0, r * kB, (r + 1) * kB); };
    EXPECT_TRUE(close(out[r].y, slice(y.detach()))) << "rank " << r << " output: " << diff(out[r].y, slice(y));
    EXPECT_TRUE(close(out[r].grad_x, slice(x.grad()) * kWorld))
        << "rank " << r << " input gradient: " << diff(out[r].grad_x, slice(x.grad()) * kWorld);
    EXPECT_TRUE(close(out[r].running_mean, ref->running_mean)) << "rank " << r;
    EXPECT_TRUE(close(out[r].running_var, ref->running_var))
        << "rank " << r << " running_var: " << diff(out[r].running_var, ref->running_var);
  }
  auto avg_w = (out[0].grad_w + out[1].grad_w) / kWorld;
  auto avg_b = (out[0].grad_b + out[1].grad_b) / kWorld;
  EXPECT_TRUE(close(avg_w, ref->weight.grad())) << diff(avg_w, ref->weight.grad());
  EXPECT_TRUE(close(avg_b, ref->bias.grad())) << diff(avg_b, ref->bias.grad());
  // The ranks' own gradients differ (they are local sums): the test would not
  // see a SyncBatchNorm that all-reduced them as well.
  EXPECT_FALSE(close(out[0].grad_w, out[1].grad_w));
}

std::shared_ptr<nn::SequentialImpl> make_net() {
  ::torch::manual_seed(21);
  auto net = std::make_shared<nn::SequentialImpl>(nn::Conv2d(nn::Conv2dOptions(kC, 4, 3).padding(1)),
                                                  dtrain::fleet::BatchNorm2d(4), nn::ReLU(),
                                                  nn::Conv2d(nn::Conv2dOptions(4, 2, 3)));
  return net;
}

// Conv + SyncBatchNorm + conv under DataParallel (which averages the
// parameter gradients): every parameter gradient and the running statistics
// equal one process's on the concatenated batch, for two steps with SGD.
TEST_P(SyncBnTest, sync_bn_UnderDataParallelEqualsOneProcess) {
  std::vector<std::vector<Tensor>> grads(kWorld), bufs(kWorld);
  auto train = [](nn::SequentialImpl& net, const Tensor& x, const Tensor& t, auto&& before, auto&& after) {
    std::vector<Tensor> g;
    for (int s = 0; s < 2; ++s) {
      net.zero_grad();
      before(s);
      auto y = net.forward(x);
      (y.square() * t.slice(2, 0, y.size(2)).slice(3, 0, y.size(3)).slice(1, 0, y.size(1))).mean().backward();
      after(s);
      for (auto& p : net.parameters()) g.push_back(p.grad().clone());
      ::torch::NoGradGuard ng;
      for (auto& p : net.parameters()) p.sub_(p.grad() * 0.5);
    }
    return g;
  };
  // Built here, not on the rank threads: the seeded initialization draws from
  // the one global generator.
  std::vector<std::shared_ptr<nn::SequentialImpl>> nets;
  for (int r = 0; r < kWorld; ++r) nets.push_back(make_net());
  dtrain::test::run_rank_threads(
      GetParam(), kWorld, seconds(60), [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
        auto net = nets[r];
        EXPECT_EQ(dtrain::fleet::enable_sync_batch_norm(*net, comm), 1);
        dtrain::fleet::DataParallel dp(net, comm, dtrain::StrategyOptions{});
        grads[r] = train(
            *net, input_of(r), target_of(r), [&](int s) { dp.begin_step(s); }, [&](int s) { dp.end_backward(s); });
        for (auto& b : net->buffers()) bufs[r].push_back(b.clone());
      });
  if (HasFailure()) return;
  auto ref = make_net();
  auto ref_grads = train(
      *ref, ::torch::cat({input_of(0), input_of(1)}), ::torch::cat({target_of(0), target_of(1)}), [](int) {},
      [](int) {});
  auto ref_bufs = ref->buffers();
  ASSERT_EQ(grads[0].size(), ref_grads.size());
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < ref_grads.size(); ++i)
      EXPECT_TRUE(close(grads[r][i], ref_grads[i]))
          << "rank " << r << " gradient " << i << ": " << diff(grads[r][i], ref_grads[i]);
    ASSERT_EQ(bufs[r].size(), ref_bufs.size());
    for (size_t i = 0; i < ref_bufs.size(); ++i)
      EXPECT_TRUE(close(bufs[r][i].to(::torch::kDouble), ref_bufs[i].to(::torch::kDouble)))
          << "rank " << r << " buffer " << i;
  }
}

// Without affine parameters, and with bfloat16 activations (CPU autocast's
// type; statistics and normalization run in float): the same global batch
// as one process's float BatchNorm2d, to bfloat16's precision.
TEST_P(SyncBnTest, sync_bn_WithoutAffineAndOnBFloat16) {
  for (auto dtype : {::torch::kFloat32, ::torch::kBFloat16}) {
    std::vector<RankResult> out(kWorld);
    auto opts = nn::BatchNormOptions(kC).affine(false);
    dtrain::test::run_rank_threads(GetParam(), kWorld, seconds(60),
                                   [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
                                     dtrain::fleet::BatchNorm2d bn(opts);
                                     dtrain::fleet::enable_sync_batch_norm(*bn, comm);
                                     bn->train();
                                     auto x = input_of(r).to(dtype).requires_grad_(true);
                                     auto y = bn(x);
                                     EXPECT_EQ(y.scalar_type(), dtype);
                                     (y.to(::torch::kFloat32) * target_of(r)).mean().backward();
                                     EXPECT_EQ(x.grad().scalar_type(), dtype);
                                     out[r].y = y.detach().to(::torch::kFloat32);
                                     out[r].grad_x = x.grad().to(::torch::kFloat32);
                                   });
    if (HasFailure()) return;
    dtrain::fleet::BatchNorm2d ref(opts);
    ref->train();
    auto x = ::torch::cat({input_of(0), input_of(1)}).to(dtype).to(::torch::kFloat32).requires_grad_(true);
    auto y = ref(x);
    (y * ::torch::cat({target_of(0), target_of(1)})).mean().backward();
    const bool f32 = dtype == ::torch::kFloat32;
    const double tol = f32 ? 1e-5 : 2e-2, grad_atol = f32 ? 1e-5 : 2e-4;
    for (int r = 0; r < kWorld; ++r) {
      auto slice = [&](const Tensor& t) { return t.slice(0, r * kB, (r + 1) * kB); };
      EXPECT_TRUE(::torch::allclose(out[r].y, slice(y.detach()), tol, tol))
          << "rank " << r << " output: " << diff(out[r].y, slice(y));
      // The input gradient is ~1e-3 here; bfloat16 keeps 2-3 significant digits.
      EXPECT_TRUE(::torch::allclose(out[r].grad_x, slice(x.grad()) * kWorld, tol, grad_atol))
          << "rank " << r << " input gradient: " << diff(out[r].grad_x, slice(x.grad()) * kWorld);
    }
  }
}

// Eval mode normalizes with the running statistics on each rank alone (no
// communication: the ranks' different inputs give their own results), exactly
// as torch::nn::BatchNorm2d does.
TEST_P(SyncBnTest, sync_bn_EvalModeIsPlainBatchNorm) {
  dtrain::test::run_rank_threads(GetParam(), kWorld, seconds(60),
                                 [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
                                   dtrain::fleet::BatchNorm2d bn(kC);
                                   nn::BatchNorm2d plain(kC);
                                   set_affine(bn);
                                   {
                                     ::torch::NoGradGuard ng;
                                     bn->running_mean.copy_(::torch::tensor({0.2f, -0.1f, 0.4f}));
                                     bn->running_var.copy_(::torch::tensor({1.3f, 0.6f, 2.0f}));
                                     plain->weight.copy_(bn->weight);
                                     plain->bias.copy_(bn->bias);
                                     plain->running_mean.copy_(bn->running_mean);
                                     plain->running_var.copy_(bn->running_var);
                                   }
                                   dtrain::fleet::enable_sync_batch_norm(*bn, comm);
                                   bn->eval();
                                   plain->eval();
                                   auto x = input_of(r);
                                   EXPECT_TRUE(::torch::equal(bn(x), plain(x))) << "rank " << r;
                                 });
}

INSTANTIATE_TEST_SUITE_P(SyncBn, SyncBnTest, ::testing::Values("gloo", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Without a communicator (or with one of size 1) training mode is
// torch::nn::BatchNorm2d too: outputs, gradients and running statistics
// identical, parameters and buffers under the same names in the same order.
TEST(SyncBn, sync_bn_WithoutCommunicatorIsTorchBatchNorm2d) {
  for (bool affine : {true, false}) {
    auto opts = nn::BatchNormOptions(kC).affine(affine).momentum(0.3);
    dtrain::fleet::BatchNorm2d bn(opts);
    nn::BatchNorm2d plain(opts);
    auto names = [](const nn::Module& m) {
      std::vector<std::string> n;
      for (const auto& p : m.named_parameters()) n.push_back("p:" + p.key());
      for (const auto& b : m.named_buffers()) n.push_back("b:" + b.key());
      return n;
    };
    EXPECT_EQ(names(*bn), names(*plain));
    auto x1 = input_of(0).requires_grad_(true), x2 = input_of(0).requires_grad_(true);
    auto y1 = bn(x1), y2 = plain(x2);
    EXPECT_TRUE(::torch::equal(y1, y2));
    (y1 * target_of(0)).sum().backward();
    (y2 * target_of(0)).sum().backward();
    EXPECT_TRUE(::torch::equal(x1.grad(), x2.grad()));
    for (size_t i = 0; i < bn->buffers().size(); ++i)
      EXPECT_TRUE(::torch::equal(bn->buffers()[i], plain->buffers()[i]));
  }
}

TEST(SyncBn, sync_bn_EnableRefusesAPlainTorchBatchNorm2dNamingIt) {
  auto net = std::make_shared<nn::SequentialImpl>();
  net->push_back(nn::Conv2d(3, 4, 3));
  net->push_back(dtrain::fleet::BatchNorm2d(4));
  net->push_back(nn::Conv2d(4, 4, 3));
  net->push_back(nn::BatchNorm2d(4));
  try {
    dtrain::fleet::enable_sync_batch_norm(*net, nullptr);
    FAIL() << "expected InvalidUsage";
  } catch (const dtrain::InvalidUsage& e) {
    EXPECT_THAT(e.what(), HasSubstr("'3'"));
    EXPECT_THAT(e.what(), HasSubstr("torch::nn::BatchNorm2d"));
    EXPECT_THAT(e.what(), HasSubstr("dtrain::fleet::BatchNorm2d"));
  }
  // Nothing was converted: the dtrain BatchNorm2d kept no communicator.
  EXPECT_FALSE((*net)[1]->as<dtrain::fleet::BatchNorm2dImpl>()->communicator());
}

}  // namespace

}  // namespace sync_bn_test
