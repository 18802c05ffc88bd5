// Recompute (activation checkpointing) through declared blocks
// (dtrain/fleet/blocks.h): a small residual net whose blocks (conv,
// BatchNorm, ReLU, dropout) run through run_block, trained one step with and
// without the recompute observer.
//
// Tolerance: 1e-6 relative (+1e-7 absolute). The recomputation repeats the
// same float ops on the same inputs, under the same RNG state (dropout), so
// the gradients are expected to be bit-identical; the tolerance only leaves
// room for a kernel that picks its reduction order by thread timing. An
// error (a missed parameter, dropout drawing a new mask, running statistics
// moved twice) changes values by 1e-2 or more.
#include <malloc.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/error.h"
#include "dtrain/fleet/blocks.h"
#include "dtrain/fleet/sync_batch_norm.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace recompute_test {

namespace {

using ::testing::HasSubstr;
namespace nn = ::torch::nn;

struct BlockImpl : nn::Module {
  explicit BlockImpl(int64_t c)
      : conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1).bias(false)))),
        bn(register_module("bn", dtrain::fleet::BatchNorm2d(c))),
        drop(register_module("drop", nn::Dropout(0.2))) {}
  ::torch::Tensor forward(const ::torch::Tensor& x) { return x + drop(::torch::relu(bn(conv(x)))); }
  nn::Conv2d conv;
  dtrain::fleet::BatchNorm2d bn;
  nn::Dropout drop;
};
TORCH_MODULE(Block);

struct NetImpl : nn::Module {
  NetImpl(int64_t c, int n) {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, c, 3).padding(1)));
    blocks = register_module("blocks", nn::Sequential());
    for (int i = 0; i < n; ++i) blocks->push_back(Block(c));
    head = register_module("head", nn::Linear(c, 5));
  }
  ::torch::Tensor forward(::torch::Tensor x) {
    x = stem(x);
    for (const auto& m : *blocks) {
      auto b = m.ptr<BlockImpl>();
      x = dtrain::fleet::run_block(
          *b, [b](const ::torch::Tensor& t) { return b->forward(t); }, x);
    }
    return head(x.mean({2, 3}));
  }
  nn::Conv2d stem{nullptr};
  nn::Sequential blocks{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

Net make_net(int64_t c = 8, int n = 3) {
  ::torch::manual_seed(11);
  return Net(c, n);
}

::torch::Tensor input(int64_t n = 4, int64_t hw = 10) {
  return ::torch::sin(::torch::arange(n * 3 * hw * hw, ::torch::kFloat32) * 0.013).reshape({n, 3, hw, hw});
}

struct Step {
  std::vector<::torch::Tensor> grads, buffers;
  ::torch::Tensor loss;
};

// One training step (forward, backward) with the given recompute checkpoints
// (nullptr: no recompute observer).
Step step(Net& net, const std::vector<std::string>* checkpoints) {
  std::unique_ptr<dtrain::fleet::BlockObserver> obs;
  if (checkpoints) {
    obs = dtrain::fleet::make_recompute_observer(net.ptr(), *checkpoints);
    dtrain::fleet::add_block_observer(obs.get());
  }
  net->train();
  net->zero_grad();
  ::torch::manual_seed(5);
  Step s;
  s.loss = net->forward(input()).square().mean();
  s.loss.backward();
  if (obs) dtrain::fleet::remove_block_observer(obs.get());
  for (const auto& p : net->parameters()) s.grads.push_back(p.grad().clone());
  for (const auto& b : net->buffers()) s.buffers.push_back(b.clone());
  return s;
}

void expect_same(const Step& a, const Step& b) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  EXPECT_TRUE(::torch::allclose(a.loss, b.loss, 1e-6, 1e-7));
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_TRUE(::torch::allclose(a.grads[i], b.grads[i], 1e-6, 1e-7))
        << "gradient " << i << ": max diff " << (a.grads[i] - b.grads[i]).abs().max().item<double>();
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i)
    EXPECT_TRUE(::torch::allclose(a.buffers[i].to(::torch::kDouble), b.buffers[i].to(::torch::kDouble), 1e-6, 1e-7))
        << "buffer " << i;
}

TEST(Recompute, recompute_AllBlocksRecomputeGivesTheSameGradientsAndRunningStats) {
  auto plain_net = make_net();
  auto plain = step(plain_net, nullptr);
  auto rc_net = make_net();
  const std::vector<std::string> all;
  auto rc = step(rc_net, &all);
  expect_same(plain, rc);
  // The running statistics moved once: num_batches_tracked is 1, not 2.
  for (const auto& item : rc_net->named_buffers()) {
    if (item.key().find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(item.value().item<int64_t>(), 1) << item.key();
    }
  }
}

TEST(Recompute, recompute_NamedSubsetRecomputeGivesTheSameGradients) {
  auto plain_net = make_net();
  auto plain = step(plain_net, nullptr);
  auto rc_net = make_net();
  const std::vector<std::string> some{"blocks.0", "blocks.2"};
  expect_same(plain, step(rc_net, &some));
}

TEST(Recompute, recompute_SecondStepAfterRecomputeStillMatches) {
  auto plain_net = make_net();
  auto rc_net = make_net();
  const std::vector<std::string> all;
  for (int i = 0; i < 2; ++i) {
    auto a = step(plain_net, nullptr);
    auto b = step(rc_net, &all);
    expect_same(a, b);
    ::torch::NoGradGuard ng;
    for (auto* n : {&plain_net, &rc_net})
      for (auto& p : (*n)->parameters()) p.sub_(p.grad() * 0.1);
  }
}

TEST(Recompute, recompute_UnknownCheckpointNameIsRefusedNamingIt) {
  auto net = make_net();
  try {
    dtrain::fleet::make_recompute_observer(net.ptr(), {"blocks.1", "blocks.9"});
    FAIL() << "expected InvalidUsage";
  } catch (const dtrain::InvalidUsage& e) {
    EXPECT_THAT(e.what(), HasSubstr("'blocks.9'"));
    EXPECT_THAT(e.what(), HasSubstr("\"blocks\""));
    EXPECT_THAT(e.what(), HasSubstr("\"stem\""));
  }
}

// Records the observer calls and each run of a block's function, to check the
// order the contract promises: before_backward of a block comes before its
// recomputation, and blocks go backward in reverse order.
struct Recorder : dtrain::fleet::BlockObserver {
  Recorder(Net& n, bool rc) : net(n), rc(rc) {}
  bool owns(const nn::Module& b) const override { return index(b) >= 0; }
  void before_forward(nn::Module& b) override { log.push_back("bf" + std::to_string(index(b))); }
  void after_forward(nn::Module& b) override { log.push_back("af" + std::to_string(index(b))); }
  void before_backward(nn::Module& b) override { log.push_back("bb" + std::to_string(index(b))); }
  bool recompute(const nn::Module&) const override { return rc; }
  int index(const nn::Module& b) const {
    for (size_t i = 0; i < net->blocks->size(); ++i)
      if (net->blocks[i].get() == &b) return static_cast<int>(i);
    return -1;
  }
  Net& net;
  bool rc;
  std::vector<std::string> log;
};

TEST(Recompute, recompute_BeforeBackwardRunsBeforeTheRecomputationInReverseBlockOrder) {
  auto net = make_net(4, 2);
  for (bool rc : {false, true}) {
    Recorder r(net, rc);
    dtrain::fleet::add_block_observer(&r);
    // Each block's function logs "run<i>" through a second wrapper.
    ::torch::Tensor x = net->stem(input());
    for (size_t i = 0; i < net->blocks->size(); ++i) {
      auto b = net->blocks[i]->as<BlockImpl>()->shared_from_this();
      auto* log = &r.log;
      x = dtrain::fleet::run_block(
          *b,
          [b, log, i](const ::torch::Tensor& t) {
            log->push_back("run" + std::to_string(i));
            return std::static_pointer_cast<BlockImpl>(b)->forward(t);
          },
          x);
    }
    x.sum().backward();
    dtrain::fleet::remove_block_observer(&r);
    std::vector<std::string> want{"bf0", "run0", "af0", "bf1", "run1", "af1", "bb1"};
    if (rc) want.push_back("run1");
    want.push_back("bb0");
    if (rc) want.push_back("run0");
    EXPECT_EQ(r.log, want) << (rc ? "with" : "without") << " recompute";
  }
}

// A block whose input does not require grad (the first block on raw input)
// still gives its parameters gradients under recompute.
TEST(Recompute, recompute_FirstBlockOnAnInputWithoutGradStillGetsGradients) {
  auto net = make_net(3, 1);
  Block b = Block(3);
  auto run = [&](bool rc) {
    std::unique_ptr<dtrain::fleet::BlockObserver> obs;
    auto holder = std::make_shared<nn::Sequential>(b);
    if (rc) {
      obs = dtrain::fleet::make_recompute_observer(holder->ptr(), {});
      dtrain::fleet::add_block_observer(obs.get());
    }
    b->zero_grad();
    ::torch::manual_seed(3);
    auto bp = b.ptr();
    dtrain::fleet::run_block(
        *bp, [bp](const ::torch::Tensor& t) { return bp->forward(t); }, input())
        .sum()
        .backward();
    if (obs) dtrain::fleet::remove_block_observer(obs.get());
    return b->conv->weight.grad().clone();
  };
  auto a = run(false);
  auto c = run(true);
  EXPECT_TRUE(::torch::allclose(a, c, 1e-6, 1e-7));
}

size_t heap_in_use() {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

// The activations a forward leaves for backward, as heap bytes still
// allocated after forward (libtorch's CPU allocator caches nothing, so the
// heap's in-use bytes are the live tensors; one intra-op thread, so every
// allocation is this thread's; the sizes are deterministic). The plain graph
// keeps several 2 MiB tensors per block (conv, BatchNorm, ReLU and dropout
// outputs, the dropout mask); with recompute only each block's input stays.
// Here 32.3 MiB against 9.5 MiB; the bound is half.
TEST(Recompute, recompute_RecomputeKeepsFewerActivationBytesAfterForward) {
  const int threads = ::torch::get_num_threads();
  ::torch::set_num_threads(1);
  auto held = [](bool rc) {
    auto net = make_net(32, 4);
    net->train();
    auto x = input(8, 44);
    std::unique_ptr<dtrain::fleet::BlockObserver> obs;
    if (rc) {
      obs = dtrain::fleet::make_recompute_observer(net.ptr(), {});
      dtrain::fleet::add_block_observer(obs.get());
    }
    const size_t before = heap_in_use();
    auto loss = net->forward(x).square().mean();
    const size_t after = heap_in_use();
    loss.backward();
    if (obs) dtrain::fleet::remove_block_observer(obs.get());
    return static_cast<double>(after) - static_cast<double>(before);
  };
  const double plain = held(false), rc = held(true);
  ::torch::set_num_threads(threads);
  std::cout << "activation bytes held after forward: plain " << plain / (1 << 20) << " MiB, recompute "
            << rc / (1 << 20) << " MiB\n";
  EXPECT_GT(plain, 16.0 * (1 << 20));
  EXPECT_LT(rc, plain / 2);
}

}  // namespace

}  // namespace recompute_test
