// The Fleet API's parameter-server half (fleet/src/ps.cc) on a real ps_grpc
// server: init_standalone runs one server in this process (gRPC on
// loopback, a memory store) and makes this process its only worker, so
// SparseEmbedding, ps_optimizer and save/load_persistables go through the
// plugin's client, the wire and the server's tables like a job's workers.
// The rule is SGD (w -= lr * g, backend_v1.h), so every expected value is
// computed here exactly.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "dtrain/config.h"
#include "dtrain/fleet/fleet.h"
#include "dtrain/fleet/ps.h"

// One unity source with its program's other files (dtrain_torch_gtests).
namespace fleet_ps_test {

namespace fleet = dtrain::fleet;
namespace fs = std::filesystem;

namespace {

constexpr float kInit = 0.25f;  // the embedding's constant initial value
constexpr float kLr = 0.5f;     // both tables' SGD rate

std::shared_ptr<const dtrain::Config> job() {
  const std::string text = std::string("[plugins]\npath = [\"") + DTRAIN_BUILT_PLUGIN_DIR +
                           "\"]\n"
                           "[ps]\nbackend = \"ps_grpc\"\ntimeout_s = 30\n"
                           "[ps.tables.emb]\nkind = \"sparse\"\ndim = 4\noptimizer = \"sgd\"\n"
                           "learning_rate = 0.5\ninitializer = \"constant\"\ninit_a = 0.25\n"
                           "[ps.tables.dense]\nkind = \"dense\"\noptimizer = \"sgd\"\nlearning_rate = 0.5\n";
  return std::make_shared<const dtrain::Config>(dtrain::Config::from_string(text, "fleet_ps_test.toml"));
}

std::string temp_dir() {
  std::string t = (fs::temp_directory_path() / "fleet_ps_XXXXXX").string();
  if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
  return t;
}

class FleetPs : public testing::Test {
 protected:
  void SetUp() override { fleet::init_standalone(job()); }
  void TearDown() override {
    fleet::stop_worker();
    fleet::shutdown();
  }
};

// Every row of ids (any shape) once, as a [n, dim] tensor, without gradients.
torch::Tensor rows_of(fleet::SparseEmbedding& emb, const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  return emb(ids).reshape({-1, emb->dim()});
}

TEST_F(FleetPs, SparseEmbeddingPullsRowsAndItsGradientsArePushedByTheStep) {
  EXPECT_TRUE(fleet::is_worker());
  fleet::SparseEmbedding emb(fleet::sparse_table_config("emb"));
  ASSERT_EQ(emb->dim(), 4);
  auto opt = fleet::ps_optimizer({emb}, nullptr);

  // Forward: shape ids.shape + [dim], every row the initial value, a leaf of the graph.
  const auto ids = torch::tensor({1, 2, 1, 3, 1, 2}, torch::kInt64).reshape({2, 3});
  auto out = emb(ids);
  EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(out.requires_grad());
  EXPECT_TRUE(torch::equal(out.detach(), torch::full({2, 3, 4}, kInit)));

  // Backward: d(sum(out * weight))/d(row) = weight; repeated ids are summed by the push.
  const auto weight = torch::arange(1, 5, torch::kFloat);  // 1 2 3 4 per column
  (out * weight).sum().backward();
  opt->step();
  EXPECT_EQ(opt->steps(), 1);

  const auto after = rows_of(emb, torch::tensor({1, 2, 3, 9}, torch::kInt64));
  const float counts[] = {3, 2, 1, 0};  // id 1 three times, 2 twice, 3 once, 9 never pushed
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t j = 0; j < 4; ++j)
      EXPECT_FLOAT_EQ(after[r][j].item<float>(), kInit - kLr * counts[r] * static_cast<float>(j + 1))
          << "row " << r << " column " << j;

  // A forward without a backward pushes zeros: the values stay.
  emb(ids);
  opt->step();
  EXPECT_TRUE(torch::equal(rows_of(emb, torch::tensor({1, 2, 3, 9}, torch::kInt64)), after));
}

// The worker merges repeated ids before they travel: the table must end as
// if it had merged them itself (rows summed; shows and clicks summed, an id
// without show_click counting show 1, click 0).
TEST_F(FleetPs, RepeatedIdsAreMergedWithTheirShowsAndClicksSummed) {
  fleet::SparseEmbedding emb(fleet::sparse_table_config("emb"));
  auto opt = fleet::ps_optimizer({emb}, nullptr);
  const auto sc = torch::tensor({1, 0, 1, 1, 1, 1, 1, 0}, torch::kFloat).reshape({4, 2});
  auto a = emb(torch::tensor({7, 8, 7, 7}, torch::kInt64), sc);
  auto b = emb(torch::tensor({8, 9}, torch::kInt64));
  (a.sum() + b.sum()).backward();
  opt->step();

  const std::string dir = temp_dir();
  fleet::save_persistables(dir, dtrain::ps::SaveMode::Full, dtrain::ps::SaveFormat::Text);
  std::map<uint64_t, std::vector<float>> rows;  // key -> 4 values, show, click
  for (const auto& f : fs::recursive_directory_iterator(fs::path(dir) / "emb")) {
    if (!f.is_regular_file() || f.path().filename() == "MANIFEST") continue;
    std::ifstream in(f.path());
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      uint64_t key = 0;
      std::vector<float> v(6);
      if (!(ls >> key)) continue;
      for (float& x : v) ls >> x;
      if (ls) rows[key] = v;
    }
  }
  fs::remove_all(dir);
  ASSERT_EQ(rows.size(), 3u);
  const float expect[3][3] = {{3, 3, 1}, {2, 2, 1}, {1, 1, 0}};  // pushes, show, click of ids 7, 8, 9
  for (int i = 0; i < 3; ++i) {
    const auto& v = rows[static_cast<uint64_t>(7 + i)];
    for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(v[j], kInit - kLr * expect[i][0]) << "id " << 7 + i;
    EXPECT_FLOAT_EQ(v[4], expect[i][1]) << "show of id " << 7 + i;
    EXPECT_FLOAT_EQ(v[5], expect[i][2]) << "click of id " << 7 + i;
  }
}

TEST_F(FleetPs, PsOptimizerAppliesOneSgdStepToTheDenseParametersOnTheServer) {
  torch::manual_seed(3);
  auto model = std::make_shared<torch::nn::LinearImpl>(3, 2);
  auto opt = fleet::ps_optimizer({}, model, "dense");
  ASSERT_TRUE(opt->dense());
  EXPECT_EQ(opt->dense()->count(), 3u * 2u + 2u);

  // The servers' initial values were pulled in: a bias of 0, weights within +-1/sqrt(fan_in).
  EXPECT_TRUE(torch::equal(model->bias.detach(), torch::zeros({2})));
  EXPECT_LE(model->weight.detach().abs().max().item<float>(), 1.0f / std::sqrt(3.0f));
  const auto w0 = model->weight.detach().clone(), b0 = model->bias.detach().clone();

  const auto x = torch::tensor({1.0f, 2.0f, -1.0f, 0.5f, 0.0f, 4.0f}).reshape({2, 3});
  model->forward(x).sum().backward();
  const auto gw = model->weight.grad().clone(), gb = model->bias.grad().clone();
  EXPECT_TRUE(torch::equal(gw, x.sum(0).expand({2, 3})));
  opt->step();
  EXPECT_TRUE(torch::allclose(model->weight.detach(), w0 - kLr * gw, 0, 1e-6));
  EXPECT_TRUE(torch::allclose(model->bias.detach(), b0 - kLr * gb, 0, 1e-6));

  // The step's values are the servers': a fresh pull brings back the same.
  const auto w1 = model->weight.detach().clone();
  {
    torch::NoGradGuard no_grad;
    model->weight.fill_(7.0f);
  }
  opt->dense()->pull();
  EXPECT_TRUE(torch::equal(model->weight.detach(), w1));

  opt->zero_grad();
  EXPECT_TRUE(!model->weight.grad().defined() || model->weight.grad().abs().sum().item<float>() == 0.0f);
}

TEST_F(FleetPs, SavePersistablesWritesEveryTableAndLoadPersistablesRestoresThem) {
  fleet::SparseEmbedding emb(fleet::sparse_table_config("emb"));
  auto model = std::make_shared<torch::nn::LinearImpl>(2, 1);
  auto opt = fleet::ps_optimizer({emb}, model, "dense");
  const auto ids = torch::tensor({5, 6, 5}, torch::kInt64);
  auto step = [&] {
    auto e = emb(ids);  // [3, 4]
    (model->forward(e.narrow(1, 0, 2)).sum() + e.sum()).backward();
    opt->step();
    opt->zero_grad();
  };
  step();
  const auto saved_rows = rows_of(emb, ids);
  const auto saved_w = model->weight.detach().clone(), saved_b = model->bias.detach().clone();

  const std::string dir = temp_dir();
  fleet::save_persistables(dir);
  for (const char* table : {"emb", "dense.weight", "dense.bias"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / table / "MANIFEST")) << table;

  step();  // moves every table away from the save
  ASSERT_FALSE(torch::equal(rows_of(emb, ids), saved_rows));

  fleet::load_persistables(dir);
  EXPECT_TRUE(torch::equal(rows_of(emb, ids), saved_rows));
  opt->dense()->pull();
  EXPECT_TRUE(torch::equal(model->weight.detach(), saved_w));
  EXPECT_TRUE(torch::equal(model->bias.detach(), saved_b));
  fs::remove_all(dir);
}

// Async with a_sync_configs.send_queue_size = 1: the steps leave their
// pushes (and the dense pull) in flight.
class FleetPsOverlap : public FleetPs {
 protected:
  void SetUp() override { fleet::init_standalone(job(), 1); }
};

TEST_F(FleetPsOverlap, PushesInFlightAreInAfterFlushAndPrefetchedRowsAreTaken) {
  fleet::SparseEmbedding emb(fleet::sparse_table_config("emb"));
  auto opt = fleet::ps_optimizer({emb}, nullptr);
  const auto ids = torch::tensor({4, 5, 4}, torch::kInt64);
  const auto weight = torch::arange(1, 5, torch::kFloat);
  for (int s = 0; s < 3; ++s) {
    (emb(ids) * weight).sum().backward();
    opt->step();
  }
  opt->flush();
  // Three pushes, id 4 twice in each.
  const auto after = rows_of(emb, torch::tensor({4, 5}, torch::kInt64));
  for (int64_t j = 0; j < 4; ++j) {
    EXPECT_FLOAT_EQ(after[0][j].item<float>(), kInit - kLr * 6 * static_cast<float>(j + 1));
    EXPECT_FLOAT_EQ(after[1][j].item<float>(), kInit - kLr * 3 * static_cast<float>(j + 1));
  }
  // A prefetch is issued after the pushes before it, so it sees them; the
  // forward with the same ids takes it, one with other ids drops it.
  emb->prefetch(ids);
  EXPECT_TRUE(torch::equal(rows_of(emb, ids), torch::stack({after[0], after[1], after[0]})));
  emb->prefetch(ids);
  EXPECT_TRUE(torch::equal(rows_of(emb, torch::tensor({9}, torch::kInt64)), torch::full({1, 4}, kInit)));
}

TEST_F(FleetPsOverlap, DenseValuesPulledByAStepArriveAtTheNextStepOrFlush) {
  torch::manual_seed(5);
  auto model = std::make_shared<torch::nn::LinearImpl>(3, 2);
  auto opt = fleet::ps_optimizer({}, model, "dense");
  const auto w0 = model->weight.detach().clone();
  const auto x = torch::tensor({1.0f, 2.0f, -1.0f});
  model->forward(x).sum().backward();
  const auto g = model->weight.grad().clone();
  opt->step();
  opt->zero_grad();  // the push in flight has its own copy of the gradients
  EXPECT_TRUE(torch::equal(model->weight.detach(), w0)) << "the parameters changed before the next step";
  opt->flush();
  EXPECT_TRUE(torch::allclose(model->weight.detach(), w0 - kLr * g, 0, 1e-6));
  // Without a flush, the next step copies the previous step's values in.
  const auto w1 = model->weight.detach().clone();
  model->forward(x).sum().backward();
  opt->step();
  opt->zero_grad();
  EXPECT_TRUE(torch::equal(model->weight.detach(), w1));
  model->forward(x).sum().backward();
  opt->step();
  EXPECT_TRUE(torch::allclose(model->weight.detach(), w1 - kLr * g, 0, 1e-6));
  opt->flush();
  EXPECT_TRUE(torch::allclose(model->weight.detach(), w1 - 2 * kLr * g, 0, 1e-6));
}

}  // namespace

}  // namespace fleet_ps_test
