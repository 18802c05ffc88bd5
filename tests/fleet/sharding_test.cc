// ZeRO sharding (strategy.sharding, stages 1-3) against plain data
// parallelism, ranks as threads over gloo and ucx: parameters after several
// steps with Momentum, Adam and LAMB, with and without clipping; sharded
// checkpoints saved at one world size and loaded at others; the memory each
// stage keeps; the strategy combinations that are refused.
//
// Tolerance: 2e-5 absolute + relative. Sharded and plain runs apply the same
// element-wise update to the same averaged gradients, but the average comes
// from a reduce-scatter instead of an all-reduce (a different summation order
// in f32), and Adam's division by sqrt(v) amplifies the last-bit differences
// over the steps; an error in the sharding (a wrong slice, a missed step, a
// stale parameter) moves parameters by 1e-3 or more.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/config.h"
#include "dtrain/error.h"
#include "dtrain/strategy.h"
#include "dtrain/fleet/blocks.h"
#include "dtrain/fleet/data_parallel.h"
#include "dtrain/fleet/optimizer.h"
#include "dtrain/fleet/optimizers.h"
#include "dtrain/fleet/sharding.h"
#include "job_text.h"
#include "rank_threads.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace sharding_test {

namespace fs = std::filesystem;
using namespace std::chrono;
namespace nn = ::torch::nn;

namespace {

constexpr int kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr int kIn = 10;

// Three blocks run through run_block (so stage 3 gathers them one by one)
// and a head outside every block (kept whole). Parameter sizes are not
// multiples of the world size, so the last slices are padded.
struct NetImpl : nn::Module {
  NetImpl() {
    blocks = register_module("blocks", nn::Sequential(nn::Linear(kIn, 13), nn::Linear(13, 17), nn::Linear(17, 11)));
    head = register_module("head", nn::Linear(11, 3));
    ::torch::NoGradGuard ng;
    int k = 0;
    for (auto& p : parameters())
      p.copy_(::torch::sin(::torch::arange(p.numel(), ::torch::kFloat32) * 0.31 + k++).reshape(p.sizes()) * 0.4);
  }
  ::torch::Tensor forward(::torch::Tensor x) {
    for (auto& b : *blocks)
      x = dtrain::fleet::run_block(
          *b.ptr(), [&](const ::torch::Tensor& t) { return ::torch::tanh(b.forward(t)); }, x);
    return head(x);
  }
  nn::Sequential blocks{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

// Step s's global batch; rank r of w takes rows [r*B/w, (r+1)*B/w).
::torch::Tensor batch(int step, int rank, int world) {
  auto all = ::torch::cos(::torch::arange(kGlobalBatch * kIn, ::torch::kFloat32).reshape({kGlobalBatch, kIn}) *
                          (0.07 + 0.013 * step));
  const int per = kGlobalBatch / world;
  return all.narrow(0, rank * per, per);
}

struct Plan {
  std::string optimizer = "adam";  // momentum | adam | lamb
  int stage = 0;                   // 0: no sharding
  double clip = 0;
  int merge = 1;  // gradient_merge.k_steps
  bool recompute = false;
};

dtrain::StrategyOptions strategy_of(const Plan& s) {
  dtrain::StrategyOptions o;
  o.fuse_grad_size_in_MB = 0.0005;  // ~500 bytes: several buckets
  o.sharding = s.stage > 0;
  o.sharding_stage = s.stage > 0 ? s.stage : 1;
  o.lamb = s.optimizer == "lamb";
  o.gradient_merge_k_steps = s.merge;
  o.recompute = s.recompute;
  return o;
}

std::shared_ptr<::torch::optim::Optimizer> make_inner(const Plan& s, Net& net) {
  if (s.optimizer == "momentum")
    return std::make_shared<::torch::optim::SGD>(net->parameters(),
                                                 ::torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
  return std::make_shared<::torch::optim::Adam>(net->parameters(), ::torch::optim::AdamOptions(0.01));
}

// One worker: model, DataParallel (with or without sharding), optimizer.
struct Worker {
  Net net;
  std::shared_ptr<dtrain::fleet::DataParallel> dp;
  std::shared_ptr<dtrain::fleet::DistributedOptimizer> opt;
  int rank = 0, world = 1;

  Worker(const Plan& s, std::shared_ptr<dtrain::Communicator> comm) {
    world = comm ? comm->size() : 1;
    rank = comm ? comm->rank() : 0;
    auto so = strategy_of(s);
    dp = std::make_shared<dtrain::fleet::DataParallel>(net.ptr(), comm, so);
    auto models = std::make_shared<dtrain::fleet::ModelSet>();
    models->add(dp);
    opt = std::make_shared<dtrain::fleet::DistributedOptimizer>(make_inner(s, net), so, models);
    if (s.clip > 0) opt->set_clip_grad_norm(s.clip);
  }
  void train(int from, int to) {
    for (int step = from; step < to; ++step) {
      auto y = net->forward(batch(step, rank, world));
      y.pow(2).mean().backward();
      if (opt->step()) opt->zero_grad();
    }
  }
  std::vector<::torch::Tensor> params() {
    if (auto* sp = dp->sharding()) sp->gather_all();
    std::vector<::torch::Tensor> out;
    for (auto& p : net->parameters()) out.push_back(p.detach().clone());
    if (auto* sp = dp->sharding()) sp->release_all();
    return out;
  }
};

void expect_close(const std::vector<::torch::Tensor>& a, const std::vector<::torch::Tensor>& b,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(::torch::allclose(a[i], b[i], 2e-5, 2e-5))
        << what << ": parameter " << i << " differs by " << (a[i] - b[i]).abs().max().item<double>();
}

// The reference: one process, the whole global batch, no sharding.
std::vector<::torch::Tensor> single_process(const Plan& s, int steps) {
  Plan plain = s;
  plain.stage = 0;
  Worker w(plain, nullptr);
  w.train(0, steps);
  return w.params();
}

std::vector<std::vector<::torch::Tensor>> on_ranks(const std::string& backend, int world, const Plan& s, int steps) {
  std::vector<std::vector<::torch::Tensor>> out(world);
  dtrain::test::run_rank_threads(backend, world, seconds(120),
                                 [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
                                   Worker w(s, comm);
                                   w.train(0, steps);
                                   out[r] = w.params();
                                 });
  return out;
}

// backend, world size, stage, optimizer
using Case = std::tuple<std::string, int, int, std::string>;
class ShardingTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardingTest, EqualsPlainDataParallel) {
  const auto& [backend, world, stage, optimizer] = GetParam();
  Plan plain{optimizer, 0, 0}, sharded{optimizer, stage, 0};
  auto want = on_ranks(backend, world, plain, 5);
  auto got = on_ranks(backend, world, sharded, 5);
  auto one = single_process(plain, 5);
  for (int r = 0; r < world; ++r) {
    expect_close(got[r], want[r], "stage " + std::to_string(stage) + " vs plain, rank " + std::to_string(r));
    expect_close(got[r], one, "stage " + std::to_string(stage) + " vs one process, rank " + std::to_string(r));
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<0>(info.param) + "_world" + std::to_string(std::get<1>(info.param)) + "_stage" +
         std::to_string(std::get<2>(info.param)) + "_" + std::get<3>(info.param);
}

INSTANTIATE_TEST_SUITE_P(Sharding, ShardingTest,
                         ::testing::Combine(::testing::Values("gloo", "ucx"), ::testing::Values(2, 4),
                                            ::testing::Values(1, 2, 3), ::testing::Values("momentum", "adam")),
                         case_name);

class ShardingBackendTest : public ::testing::TestWithParam<std::string> {};

// Clipping by global norm under sharding (each rank holds a slice of every
// gradient) equals clipping the whole gradient in one process; the limit is
// low enough that every step clips.
TEST_P(ShardingBackendTest, ClipGradNormEqualsOneProcess) {
  for (int stage : {0, 2, 3}) {
    Plan s{"momentum", stage, 0.05};
    auto got = on_ranks(GetParam(), 3, s, 4);
    auto one = single_process(s, 4);
    Plan unclipped{"momentum", 0, 0};
    auto free = single_process(unclipped, 4);
    EXPECT_FALSE(::torch::allclose(one[0], free[0], 1e-4, 1e-4)) << "the limit never clipped";
    for (int r = 0; r < 3; ++r) expect_close(got[r], one, "clip, stage " + std::to_string(stage));
  }
}

// Stage 1 with gradient merge (2 micro-steps per update) equals plain data
// parallelism with it; stage 3 under recompute (the blocks' parameters are
// gathered again before the recomputation in backward) equals plain.
TEST_P(ShardingBackendTest, GradientMergeAndRecompute) {
  Plan merged{"adam", 1, 0, 2, false}, plain_merged{"adam", 0, 0, 2, false};
  auto want = on_ranks(GetParam(), 2, plain_merged, 6);
  auto got = on_ranks(GetParam(), 2, merged, 6);
  for (int r = 0; r < 2; ++r) expect_close(got[r], want[r], "stage 1 with gradient_merge 2");
  Plan recomputed{"momentum", 3, 0, 1, true};
  auto got3 = on_ranks(GetParam(), 3, recomputed, 4);
  auto one = single_process(Plan{"momentum", 0, 0, 1, false}, 4);
  for (int r = 0; r < 3; ++r) expect_close(got3[r], one, "stage 3 with recompute");
}

// LAMB's trust ratios need each parameter's norms: under sharding they are
// summed over the slices of every rank.
TEST_P(ShardingBackendTest, LambEqualsOneProcess) {
  Plan s{"lamb", 2, 0};
  auto got = on_ranks(GetParam(), 3, s, 4);
  auto one = single_process(s, 4);
  for (int r = 0; r < 3; ++r) expect_close(got[r], one, "lamb under sharding");
}

// A sharded checkpoint saved by 2 ranks loads at 1 (sharded and unsharded)
// and at 3 ranks, and training goes on as one process trains throughout.
TEST_P(ShardingBackendTest, CheckpointLoadsAtOtherWorldSizes) {
  const std::string backend = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("dtrain-sharding-ckpt-" + backend + "-" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (int stage : {1, 3}) {
    Plan s{"adam", stage, 0};
    dtrain::test::run_rank_threads(backend, 2, seconds(120),
                                   [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
                                     Worker w(s, comm);
                                     w.train(0, 3);
                                     ::torch::serialize::OutputArchive ar;
                                     dtrain::fleet::save_shard(ar, *w.dp->sharding(), w.opt->inner());
                                     ar.save_to((dir / ("shard-" + std::to_string(r) + ".pt")).string());
                                   });
    auto load = [&](std::vector<::torch::serialize::InputArchive>& ars) {
      ars.resize(2);
      for (int r = 0; r < 2; ++r) ars[r].load_from((dir / ("shard-" + std::to_string(r) + ".pt")).string());
    };
    auto one = single_process(s, 6);
    for (int world : {1, 3}) {
      std::vector<std::vector<::torch::Tensor>> got(world);
      dtrain::test::run_rank_threads(backend, world, seconds(120),
                                     [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
                                       Worker w(s, comm);
                                       std::vector<::torch::serialize::InputArchive> ars;
                                       load(ars);
                                       dtrain::fleet::load_shards(ars, *w.dp->sharding(), w.opt->inner());
                                       w.opt->set_next_step(3);
                                       w.train(3, 6);
                                       got[r] = w.params();
                                     });
      for (int r = 0; r < world; ++r)
        expect_close(got[r], one,
                     "stage " + std::to_string(stage) + " saved at 2, resumed at " + std::to_string(world));
    }
    Plan plain{"adam", 0, 0};
    Worker w(plain, nullptr);
    std::vector<::torch::serialize::InputArchive> ars;
    load(ars);
    dtrain::fleet::load_shards_unsharded(ars, *w.net, w.opt->inner());
    w.train(3, 6);
    expect_close(w.params(), one, "stage " + std::to_string(stage) + " saved at 2, resumed unsharded");
  }
  fs::remove_all(dir);
}

// What a rank keeps between steps: stage 1 shards the optimizer state, stage 2
// the gradients too, stage 3 the parameters of the declared blocks too.
TEST_P(ShardingBackendTest, MemoryPerStage) {
  std::map<int, dtrain::fleet::ShardedParameters::Memory> mem;
  std::map<int, int64_t> state;
  for (int stage : {1, 2, 3}) {
    Plan s{"adam", stage, 0};
    dtrain::test::run_rank_threads(GetParam(), 4, seconds(120),
                                   [&](int r, const std::shared_ptr<dtrain::Communicator>& comm) {
                                     Worker w(s, comm);
                                     w.train(0, 2);
                                     if (r != 1) return;
                                     mem[stage] = w.dp->sharding()->memory();
                                     state[stage] = dtrain::fleet::optimizer_state_bytes(w.opt->inner());
                                   });
  }
  int64_t whole = 0, head = 0;
  Net net;
  for (auto& p : net->parameters()) whole += p.numel() * 4;
  for (auto& p : net->head->parameters()) head += p.numel() * 4;
  // Adam: two moments per element, padded slices of a quarter.
  for (int stage : {1, 2, 3}) EXPECT_LE(state[stage], whole / 2 + 256) << "stage " << stage;
  EXPECT_GE(mem[1].gradient_bytes, whole);
  EXPECT_LE(mem[2].gradient_bytes, whole / 4 + 256);
  EXPECT_GE(mem[2].parameter_bytes, whole);
  EXPECT_LE(mem[3].parameter_bytes, whole / 4 + head + 256);
}

INSTANTIATE_TEST_SUITE_P(Sharding, ShardingBackendTest, ::testing::Values("gloo", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

dtrain::StrategyOptions from_toml(const std::string& text) {
  return dtrain::StrategyOptions::from_config(dtrain::test::job_text(text, dtrain::add_strategy_keys));
}

std::string refusal(const std::string& text) {
  try {
    from_toml(text);
  } catch (const dtrain::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ShardingConfig, PaddleNamesAndRefusals) {
  auto o = from_toml("[strategy]\nsharding = true\n[strategy.sharding_configs]\nstage = 3\n");
  EXPECT_TRUE(o.sharding);
  EXPECT_EQ(o.sharding_stage, 3);
  EXPECT_NE(refusal("[strategy]\nsharding = true\n[strategy.sharding_configs]\nstage = 4\n"), "");
  EXPECT_NE(refusal("[strategy]\nsharding = true\na_sync = true\n").find("a_sync"), std::string::npos);
  EXPECT_NE(refusal("[strategy]\nsharding = true\n[strategy.sharding_configs]\nstage = 3\n[strategy.localsgd]\nk_"
                    "steps = 4\n")
                .find("local SGD"),
            std::string::npos);
  EXPECT_NE(refusal("[strategy]\nsharding = true\n[strategy.sharding_configs]\nstage = 2\n[strategy.gradient_"
                    "merge]\nk_steps = 2\n")
                .find("stage 1 only"),
            std::string::npos);
  EXPECT_NE(refusal("[strategy]\nlamb = true\nlars = true\n").find("choose one"), std::string::npos);
}

}  // namespace

}  // namespace sharding_test
