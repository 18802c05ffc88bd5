#include <atomic>
#include <cmath>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/communicator.h"
#include "dtrain/config.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"
#include "dtrain/strategy.h"
#include "job_text.h"
#include "rank_threads.h"

using namespace dtrain;
using ::testing::HasSubstr;

namespace {

template <typename F>
void run_ranks(int world, F fn) {
  dtrain::test::run_rank_threads("gloo", world, std::chrono::seconds(30), fn);
}

Config strategy_config(const std::string& text) { return dtrain::test::job_text(text, add_strategy_keys); }

// The ConfigError reading the strategy of `text` raises (a failure if none).
ConfigError strategy_error(const std::string& text) {
  try {
    StrategyOptions::from_config(strategy_config(text));
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted:\n" << text;
  return ConfigError("", 0, 0, "", "");
}

}  // namespace

TEST(StrategyOptions, ReadsPaddleNames) {
  auto o = StrategyOptions::from_config(
      strategy_config("[strategy]\nfuse_all_reduce_ops = false\nfuse_grad_size_in_MB = 4\nfp16_allreduce = true\n"
                      "fp16_allreduce_dtype = \"bf16\"\n[strategy.gradient_merge]\nk_steps = 4\navg = false\n"));
  EXPECT_FALSE(o.fuse_all_reduce_ops);
  EXPECT_EQ(o.bucket_bytes(), 4u << 20);
  EXPECT_TRUE(o.fp16_allreduce);
  EXPECT_EQ(o.wire_dtype, DType::BF16);
  EXPECT_EQ(o.gradient_merge_k_steps, 4);
  EXPECT_FALSE(o.gradient_merge_avg);
  Strategy s(o);
  EXPECT_FALSE(s.sync_gradients_at(0));
  EXPECT_TRUE(s.sync_gradients_at(3));
  EXPECT_TRUE(s.optimizer_step_at(7));
  EXPECT_DOUBLE_EQ(s.gradient_scale(), 1.0);
}

TEST(StrategyOptions, LocalSgdAveragesEveryKSteps) {
  Strategy s(StrategyOptions::from_config(strategy_config("[strategy.localsgd]\nk_steps = 3\nbegin_step = 2\n")));
  EXPECT_TRUE(s.sync_gradients_at(0));
  EXPECT_TRUE(s.sync_gradients_at(1));
  EXPECT_FALSE(s.sync_gradients_at(2));
  EXPECT_FALSE(s.average_parameters_at(3));
  EXPECT_TRUE(s.average_parameters_at(5));
}

TEST(StrategyOptions, ParameterServerModesFromPaddleNames) {
  auto sync = StrategyOptions::from_config(strategy_config("[strategy]\na_sync = false\n"));
  EXPECT_FALSE(sync.a_sync);
  EXPECT_EQ(sync.ps_mode.mode, ps::Mode::Sync);
  EXPECT_EQ(StrategyOptions::from_config(strategy_config("")).ps_mode.mode, ps::Mode::Sync);

  auto async = StrategyOptions::from_config(strategy_config("[strategy]\na_sync = true\n"));
  EXPECT_TRUE(async.a_sync);
  EXPECT_EQ(async.ps_mode.mode, ps::Mode::Async);
  EXPECT_EQ(async.ps_mode.geo_k_steps, 0);
  auto async0 = StrategyOptions::from_config(
      strategy_config("[strategy]\na_sync = true\n[strategy.a_sync_configs]\nk_steps = 0\n"));
  EXPECT_EQ(async0.ps_mode.mode, ps::Mode::Async);

  auto geo = StrategyOptions::from_config(
      strategy_config("[strategy]\na_sync = true\n[strategy.a_sync_configs]\nk_steps = 4\n"));
  EXPECT_EQ(geo.ps_mode.mode, ps::Mode::Geo);
  EXPECT_EQ(geo.ps_mode.geo_k_steps, 4);
  EXPECT_THAT(geo.describe(), HasSubstr("a_sync=true (ps geo, k_steps=4)"));
  EXPECT_STREQ(ps::to_string(ps::Mode::Async), "async");
}

TEST(StrategyOptions, ParameterServerKeysBadCombinationsNameTheKey) {
  ConfigError no_async = strategy_error("[strategy.a_sync_configs]\nk_steps = 5\n");
  EXPECT_EQ(no_async.key(), "strategy.a_sync_configs.k_steps");
  EXPECT_EQ(no_async.line(), 2);
  EXPECT_THAT(no_async.what(), HasSubstr("needs a_sync = true"));
  ConfigError negative = strategy_error("[strategy]\na_sync = true\n[strategy.a_sync_configs]\nk_steps = -1\n");
  EXPECT_EQ(negative.key(), "strategy.a_sync_configs.k_steps");
  EXPECT_THAT(negative.what(), HasSubstr("must be >= 0"));
  ConfigError merge = strategy_error("[strategy]\na_sync = true\n[strategy.gradient_merge]\nk_steps = 2\n");
  EXPECT_EQ(merge.key(), "strategy.gradient_merge.k_steps");
  EXPECT_THAT(merge.what(), HasSubstr("cannot be combined with a_sync = true"));
}

// A collective job with a_sync = true fails where it would change training:
// building the gradient all-reduce.
TEST(StrategyOptions, CollectiveGradientSyncRefusesASync) {
  auto o = StrategyOptions::from_config(strategy_config("[strategy]\na_sync = true\n"));
  run_ranks(1, [&](int, std::shared_ptr<Communicator> comm) {
    try {
      GradientBuckets b(comm, {4, 4}, o);
      ADD_FAILURE() << "GradientBuckets accepted a_sync = true";
    } catch (const InvalidUsage& e) {
      EXPECT_THAT(e.what(), HasSubstr("a_sync = true asks for parameter-server training (async mode)"));
    }
  });
}

TEST(StrategyOptions, BadValuesNameTheKey) {
  ConfigError zero = strategy_error("[strategy.gradient_merge]\nk_steps = 0\n");
  EXPECT_EQ(zero.key(), "strategy.gradient_merge.k_steps");
  EXPECT_EQ(zero.line(), 2);
  try {
    strategy_config("[strategy]\nfuse_grad_size_MB = 3\n");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("fuse_grad_size_in_MB"));
  }
}

TEST(GradientBuckets, LayoutIsReverseOrderAndCapped) {
  run_ranks(1, [](int, std::shared_ptr<Communicator> comm) {
    StrategyOptions o;
    o.fuse_grad_size_in_MB = 40.0 / (1024 * 1024);  // 10 floats
    GradientBuckets b(comm, {4, 4, 4, 20, 2}, o);
    ASSERT_EQ(b.num_buckets(), 4u);
    EXPECT_EQ(b.bucket_members(0), (std::vector<size_t>{4}));
    EXPECT_EQ(b.bucket_members(1), (std::vector<size_t>{3}));
    EXPECT_EQ(b.bucket_members(2), (std::vector<size_t>{2, 1}));
    EXPECT_EQ(b.bucket_members(3), (std::vector<size_t>{0}));
    o.fuse_all_reduce_ops = false;
    GradientBuckets one(comm, {4, 4, 4}, o);
    EXPECT_EQ(one.num_buckets(), 3u);
  });
}

// Each rank's gradient for tensor i element j is (rank+1)*(i+1)+j; the average
// must come back into every buffer, whatever order the tensors are marked in.
class BucketSync : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(BucketSync, AveragesAcrossRanksInAnyMarkOrder) {
  const bool fuse = std::get<0>(GetParam()), fp16 = std::get<1>(GetParam());
  const int world = 3;
  const std::vector<size_t> counts{100, 3, 1000, 7, 50};
  run_ranks(world, [&](int r, std::shared_ptr<Communicator> comm) {
    StrategyOptions o;
    o.fuse_all_reduce_ops = fuse;
    o.fuse_grad_size_in_MB = 2000.0 / (1024 * 1024);
    o.fp16_allreduce = fp16;
    GradientBuckets b(comm, counts, o);
    std::vector<std::vector<float>> grads(counts.size());
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < counts.size(); ++i) {
        grads[i].resize(counts[i]);
        for (size_t j = 0; j < counts[i]; ++j) grads[i][j] = float((r + 1) * (i + 1 + step) + j % 10) * 0.25f;
      }
      b.begin();
      // Ranks mark in different orders; launch order must still agree.
      std::vector<size_t> order{4, 3, 2, 1, 0};
      if (r == 1) order = {0, 1, 2, 3, 4};
      if (r == 2) order = {2, 4, 0, 3, 1};
      for (size_t i : order) b.mark_ready(i, Buffer::of(grads[i].data(), counts[i]));
      b.finish();
      const double mean_rank = (world + 1) / 2.0;
      for (size_t i = 0; i < counts.size(); ++i)
        for (size_t j = 0; j < counts[i]; ++j) {
          double want = (mean_rank * (i + 1 + step) + j % 10) * 0.25;
          if (fp16)
            ASSERT_NEAR(grads[i][j], want, std::abs(want) * 2e-3 + 1e-3) << "tensor " << i << " elem " << j;
          else
            ASSERT_FLOAT_EQ(grads[i][j], float(want)) << "tensor " << i << " elem " << j;
        }
    }
    EXPECT_EQ(b.stats().allreduces, int64_t(3 * b.num_buckets()));
    EXPECT_EQ(b.stats().bytes_on_wire, int64_t(3 * 1160 * (fp16 ? 2 : 4)));
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, BucketSync, ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(GradientBuckets, UnmarkedTensorsCountAsZeroAndAreLeftAlone) {
  run_ranks(2, [](int r, std::shared_ptr<Communicator> comm) {
    GradientBuckets b(comm, {2, 2}, StrategyOptions{});
    std::vector<float> g0{1, 2}, g1{10, 20};
    b.begin();
    b.mark_ready(1, Buffer::of(g1.data(), 2));
    if (r == 0) b.mark_ready(0, Buffer::of(g0.data(), 2));
    b.finish();
    EXPECT_EQ(g1, (std::vector<float>{10, 20}));
    if (r == 0)
      EXPECT_EQ(g0, (std::vector<float>{0.5f, 1}));
    else
      EXPECT_EQ(g0, (std::vector<float>{1, 2}));
  });
}

TEST(GradientBuckets, GradientsKeptInTheirSlotsAreAveragedInPlace) {
  run_ranks(2, [](int r, std::shared_ptr<Communicator> comm) {
    StrategyOptions o;
    o.fuse_grad_size_in_MB = 12.0 / (1024 * 1024);  // 3 floats: one tensor per bucket
    GradientBuckets b(comm, {3, 2, 3}, o);
    ASSERT_EQ(b.num_buckets(), 3u);
    float* s0 = b.slot(0);
    float* s2 = b.slot(2);
    EXPECT_NE(s0, b.slot(1));
    EXPECT_THROW(b.slot(3), InvalidUsage);
    std::vector<float> g1{float(r), float(10 * r)};  // tensor 1 lives outside: copied in and out
    for (int j = 0; j < 3; ++j) s0[j] = float(r * 4 + j), s2[j] = float(r);
    b.begin();
    b.mark_ready(2, Buffer::of(s2, 3));
    b.mark_ready(1, Buffer::of(g1.data(), 2));
    b.mark_ready(0, Buffer::of(s0, 3));
    b.finish();
    EXPECT_EQ(std::vector<float>(s0, s0 + 3), (std::vector<float>{2, 3, 4}));
    EXPECT_EQ(g1, (std::vector<float>{0.5f, 5}));
    EXPECT_EQ(std::vector<float>(s2, s2 + 3), std::vector<float>(3, 0.5f));
    // The slots keep their values into the next step (gradients accumulate
    // there); one never marked counts as zero.
    for (int j = 0; j < 3; ++j) s0[j] += float(r);
    b.begin();
    b.mark_ready(0, Buffer::of(s0, 3));
    b.finish();
    EXPECT_EQ(std::vector<float>(s0, s0 + 3), (std::vector<float>{2.5f, 3.5f, 4.5f}));
    EXPECT_EQ(std::vector<float>(s2, s2 + 3), std::vector<float>(3, 0.0f));
    EXPECT_EQ(b.stats().bytes_on_wire, int64_t(2 * 8 * 4));
  });
}

TEST(GradientBuckets, RejectsMisuse) {
  run_ranks(1, [](int, std::shared_ptr<Communicator> comm) {
    GradientBuckets b(comm, {2}, StrategyOptions{});
    std::vector<float> g(3);
    EXPECT_THROW(b.mark_ready(0, Buffer::of(g.data(), 2)), InvalidUsage);  // outside a step
    b.begin();
    EXPECT_THROW(b.mark_ready(0, Buffer::of(g.data(), 3)), InvalidUsage);
    EXPECT_THROW(b.mark_ready(1, Buffer::of(g.data(), 2)), InvalidUsage);
    b.finish();
  });
}

TEST(Collectives, AverageAndBroadcastBuffers) {
  run_ranks(2, [](int r, std::shared_ptr<Communicator> comm) {
    std::vector<float> a(5, float(r)), b(300, float(2 * r));
    average_buffers(*comm, {Buffer::of(a.data(), a.size()), Buffer::of(b.data(), b.size())}, 64);
    EXPECT_EQ(a, std::vector<float>(5, 0.5f));
    EXPECT_EQ(b, std::vector<float>(300, 1.0f));
    std::vector<int64_t> c(3, r + 7);
    std::vector<float> d(10, float(r + 1));
    broadcast_buffers(*comm, {Buffer::of(c.data(), 3), Buffer::of(d.data(), 10)}, 1, 16);
    EXPECT_EQ(c, std::vector<int64_t>(3, 8));
    EXPECT_EQ(d, std::vector<float>(10, 2.0f));
  });
}

TEST(Collectives, LayoutMismatchNamesTheFirstDifferingParameter) {
  std::vector<std::string> msgs(3);
  run_ranks(3, [&](int r, std::shared_ptr<Communicator> comm) {
    std::vector<std::string> names{"conv.weight", "fc.weight", "fc.bias"};
    std::vector<std::vector<int64_t>> shapes{{8, 1, 3, 3}, {10, 64}, {10}};
    check_same_layout(*comm, names, shapes);  // identical: no error
    if (r == 2) shapes[1] = {10, 32};
    try {
      check_same_layout(*comm, names, shapes);
      msgs[r] = "no error";
    } catch (const InvalidUsage& e) {
      msgs[r] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_THAT(msgs[r], HasSubstr("parameter #1")) << r;
  EXPECT_THAT(msgs[2], HasSubstr("'fc.weight' [10, 32] on rank 2 but 'fc.weight' [10, 64] on rank 0"));
  EXPECT_THAT(msgs[0], HasSubstr("another rank differs"));
}

TEST(HalfFloats, RoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 1e-3f}) {
    EXPECT_NEAR(f16_to_float(float_to_f16(f)), f, std::abs(f) * 1e-3);
    EXPECT_NEAR(bf16_to_float(float_to_bf16(f)), f, std::abs(f) * 1e-2);
  }
}
