// AMP's dynamic loss scaling (strategy.amp, amp_configs.dtype = "float16"):
// the core's LossScaler rules, and through DistributedOptimizer on ranks as
// threads over gloo and ucx: an inf in one gradient element on one rank makes
// every rank skip that step and shrink the scale the same way, also under
// sharding stage 2, where only the owner of that element's slice sees the inf
// after the reduce-scatter (so the skip must come from the all-reduced flag).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/strategy.h"
#include "dtrain/fleet/data_parallel.h"
#include "dtrain/fleet/optimizer.h"
#include "rank_threads.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace amp_test {

using namespace std::chrono;

namespace {

dtrain::StrategyOptions amp_options() {
  dtrain::StrategyOptions o;
  o.amp = true;
  o.amp_dtype = dtrain::DType::F16;
  o.amp_init_loss_scaling = 1024;
  o.amp_incr_every_n_steps = 3;
  o.amp_decr_every_n_nan_or_inf = 1;
  o.amp_incr_ratio = 2;
  o.amp_decr_ratio = 0.5;
  return o;
}

TEST(AmpLossScaler, PaddleRules) {
  auto o = amp_options();
  o.amp_decr_every_n_nan_or_inf = 2;
  dtrain::LossScaler s(o);
  ASSERT_TRUE(s.enabled());
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(true));  // one overflow: counted, not yet shrunk, and the good run restarts
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true));  // the second in a row shrinks
  EXPECT_EQ(s.scale(), 512);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);  // incr_every_n_steps good steps grow it
  dtrain::LossScaler copy(o);
  copy.set_state(s.state());
  EXPECT_EQ(copy.scale(), 1024);
  for (int i = 0; i < 40; ++i) copy.update(true);
  EXPECT_EQ(copy.scale(), 1);  // never below 1

  o.amp_use_dynamic_loss_scaling = false;
  dtrain::LossScaler fixed(o);
  EXPECT_TRUE(fixed.update(true));
  EXPECT_EQ(fixed.scale(), 1024);
  o.amp_dtype = dtrain::DType::BF16;
  EXPECT_FALSE(dtrain::LossScaler(o).enabled());  // bfloat16 needs no scaler
}

struct Trace {
  std::vector<bool> skipped;
  std::vector<double> scale;
  std::vector<::torch::Tensor> before_bad, after_bad;
};

std::vector<::torch::Tensor> snapshot(::torch::nn::Sequential& net) {
  std::vector<::torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

// 7 steps; at step 2 rank 1 puts an inf into element 5 of the first weight's gradient.
std::vector<Trace> run(const std::string& backend, int stage) {
  const int world = 2, bad_step = 2;
  std::vector<Trace> out(world);
  dtrain::test::run_rank_threads(
      backend, world, seconds(60), [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
        ::torch::manual_seed(7);
        ::torch::nn::Sequential net(::torch::nn::Linear(6, 8), ::torch::nn::Tanh(), ::torch::nn::Linear(8, 2));
        auto o = amp_options();
        o.sharding = stage > 0;
        o.sharding_stage = stage > 0 ? stage : 1;
        auto dp = std::make_shared<dtrain::fleet::DataParallel>(net.ptr(), comm, o);
        auto models = std::make_shared<dtrain::fleet::ModelSet>();
        models->add(dp);
        dtrain::fleet::DistributedOptimizer opt(
            std::make_shared<::torch::optim::SGD>(net->parameters(), ::torch::optim::SGDOptions(0.1)), o, models);
        auto w = net->parameters()[0];
        int step = 0;
        auto hook = w.register_hook([&](const ::torch::Tensor& g) {
          if (r != 1 || step != bad_step) return g;
          auto h = g.clone();
          h.view({-1})[5] = std::numeric_limits<float>::infinity();
          return h;
        });
        for (step = 0; step < 7; ++step) {
          auto x = ::torch::cos(::torch::arange(24, ::torch::kFloat32).reshape({4, 6}) * (0.3 + 0.1 * step + r));
          auto loss = net->forward(x).pow(2).mean();
          if (step == bad_step) out[r].before_bad = snapshot(net);
          opt.scale(loss).backward();
          if (opt.step()) opt.zero_grad();
          if (step == bad_step) out[r].after_bad = snapshot(net);
          out[r].skipped.push_back(opt.last_step_skipped());
          out[r].scale.push_back(opt.loss_scaler().scale());
        }
        w.remove_hook(hook);
      });
  return out;
}

class AmpTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(AmpTest, InfOnOneRankSkipsTheStepEverywhere) {
  auto t = run(std::get<0>(GetParam()), std::get<1>(GetParam()));
  const std::vector<bool> skipped{false, false, true, false, false, false, false};
  // 1024; the inf halves it; three good steps (3, 4, 5) double it again.
  const std::vector<double> scale{1024, 1024, 512, 512, 512, 1024, 1024};
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(t[r].skipped, skipped) << "rank " << r;
    EXPECT_EQ(t[r].scale, scale) << "rank " << r;
    ASSERT_EQ(t[r].before_bad.size(), t[r].after_bad.size());
    for (size_t i = 0; i < t[r].before_bad.size(); ++i)
      EXPECT_TRUE(::torch::equal(t[r].before_bad[i], t[r].after_bad[i]))
          << "rank " << r << " changed parameter " << i << " in the skipped step";
  }
  auto a = t[0].after_bad, b = t[1].after_bad;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(::torch::allclose(a[i], b[i])) << "ranks differ, parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(Amp, AmpTest, ::testing::Combine(::testing::Values("gloo", "ucx"), ::testing::Values(0, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& i) {
                           const int stage = std::get<1>(i.param);
                           return std::get<0>(i.param) +
                                  (stage ? "_sharding_stage" + std::to_string(stage) : std::string("_plain"));
                         });

}  // namespace

}  // namespace amp_test
