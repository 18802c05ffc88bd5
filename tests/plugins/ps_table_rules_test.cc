// The table engine (plugins/ps_grpc/engine/table.h) without gRPC: sharding,
// initializers, and every optimizer rule against a reference computed from
// backend_v1.h's formulas (sparse rows, dense values, dense pushes in
// ranges), and GEO mode's pushes added as they are.

#include "ps_table_util.h"

namespace dtrain::ps_grpc {
namespace {

using namespace table_test;  // NOLINT(build/namespaces)

TEST(Sharding, DenseRangesSplitEvenlyFirstServersTakeTheRest) {
  Sharding sh{3, 64};
  EXPECT_EQ(sh.dense_begin(7, 0), 0u);
  EXPECT_EQ(sh.dense_end(7, 0), 3u);
  EXPECT_EQ(sh.dense_end(7, 1), 5u);
  EXPECT_EQ(sh.dense_end(7, 2), 7u);
  EXPECT_EQ(sh.dense_end(2, 2), 2u);  // dim < servers: the last holds nothing
  EXPECT_EQ(sh.dense_begin(2, 2), 2u);
  for (uint64_t k : {0ull, 1ull, 12345ull, ~0ull}) {
    EXPECT_EQ(sh.shard_of(k), ref_mix(k) % 64);
    EXPECT_EQ(sh.server_of(k), static_cast<int>(ref_mix(k) % 64 % 3));
  }
}

TEST(Initializer, RowsDependOnlyOnSeedKeyAndIndexOnAnyServerCount) {
  for (int init : {DT_PS_INIT_CONSTANT, DT_PS_INIT_UNIFORM, DT_PS_INIT_NORMAL}) {
    TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 6);
    d.initializer = init;
    d.init_a = init == DT_PS_INIT_NORMAL ? 0.5 : -0.25;
    d.init_b = init == DT_PS_INIT_NORMAL ? 0.125 : 0.25;
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 500; ++k) keys.push_back(k * 7919 + (k % 3 == 0 ? (1ull << 63) : 0));
    Cluster one(d, 1, 1), three(d, 3, 1, 8);
    const auto a = one.pull(0, keys), b = three.pull(0, keys);
    ASSERT_EQ(a, b);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      for (uint64_t j = 0; j < d.dim; ++j) {
        const float v = a[i * d.dim + j];
        ASSERT_EQ(v, ref_init(d, keys[i], j)) << "init " << init << " key " << keys[i] << " j " << j;
        if (init == DT_PS_INIT_UNIFORM) {
          ASSERT_TRUE(v >= -0.25f && v < 0.25f);
        }
        sum += v;
        sq += v * v;
      }
    const double n = keys.size() * d.dim, mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    if (init == DT_PS_INIT_NORMAL) {
      EXPECT_NEAR(mean, 0.5, 0.01);
      EXPECT_NEAR(sd, 0.125, 0.01);
    }
    EXPECT_EQ(one.rows(), 0u) << "a pull creates no row";
  }
  // Dense: value g is the initializer at global index g.
  TableDesc dd = dense_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 11);
  Cluster one(dd, 1, 1), three(dd, 3, 1);
  const auto a = one.pull_dense(0), b = three.pull_dense(0);
  ASSERT_EQ(a, b);
  for (uint64_t g = 0; g < 11; ++g) EXPECT_EQ(a[g], ref_init(dd, g, 0));
}

// ---- optimizer rules against the reference ----

class Rules : public testing::TestWithParam<int> {};

TEST_P(Rules, SparseRowsFollowTheFormulasWithRepeatedKeysSummed) {
  const TableDesc d = sparse_desc(GetParam(), DT_PS_MODE_ASYNC, 5);
  Cluster c(d, 2, 1, 8);
  std::mt19937_64 rng(1);
  std::map<uint64_t, RefRow> ref;
  std::map<uint64_t, std::pair<float, float>> sc_ref;
  for (int step = 0; step < 6; ++step) {
    std::vector<uint64_t> keys;
    for (int i = 0; i < 40; ++i) keys.push_back(rng() % 30);  // repeats within a push
    const auto g = random_grads(rng, keys.size() * d.dim);
    std::vector<float> sc(keys.size() * 2);
    for (size_t i = 0; i < keys.size(); ++i) sc[2 * i] = 1.0f, sc[2 * i + 1] = (i % 4 == 0) ? 1.0f : 0.0f;
    c.push(0, keys, g, &sc);
    std::map<uint64_t, std::vector<float>> summed;
    std::vector<uint64_t> order;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = summed.find(keys[i]);
      if (it == summed.end()) {
        summed[keys[i]] = std::vector<float>(&g[i * d.dim], &g[i * d.dim] + d.dim);
        order.push_back(keys[i]);
      } else {
        for (uint64_t j = 0; j < d.dim; ++j) it->second[j] = it->second[j] + g[i * d.dim + j];
      }
      sc_ref[keys[i]].first += sc[2 * i];
      sc_ref[keys[i]].second += sc[2 * i + 1];
    }
    for (uint64_t k : order) {
      if (!ref.count(k)) ref[k] = ref_new_row(d, k, d.dim, false);
      ref_step(d, ref[k], summed[k], false);
    }
  }
  std::vector<uint64_t> all;
  for (uint64_t k = 0; k < 35; ++k) all.push_back(k);
  const auto got = c.pull(0, all);
  for (uint64_t k : all) {
    const RefRow r = ref.count(k) ? ref[k] : ref_new_row(d, k, d.dim, false);
    for (uint64_t j = 0; j < d.dim; ++j) ASSERT_EQ(got[k * d.dim + j], r.w[j]) << "key " << k << " value " << j;
  }
  EXPECT_EQ(c.rows(), ref.size());
  // The counters: a FULL text save has "key v.. show click unseen changed [state]".
  for (const auto& line : dump(c)) {
    std::istringstream in(line);
    uint64_t key;
    in >> key;
    std::vector<float> cols;
    for (float x; in >> x;) cols.push_back(x);
    ASSERT_GE(cols.size(), d.dim + 4);
    EXPECT_EQ(cols[d.dim], sc_ref[key].first);
    EXPECT_EQ(cols[d.dim + 1], sc_ref[key].second);
    EXPECT_EQ(cols[d.dim + 2], 0.0f) << "unseen_days";
    EXPECT_EQ(cols[d.dim + 3], 1.0f) << "changed";
  }
}

// `steps` pushes of random gradients (seeded) from worker 0 to a dense table;
// returns the row the formulas give.
RefRow push_dense_steps(Cluster& c, const TableDesc& d, uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  RefRow ref = ref_new_row(d, 0, d.dim, true);
  for (int step = 0; step < steps; ++step) {
    const auto g = random_grads(rng, d.dim);
    c.push_dense(0, g);
    ref_step(d, ref, g, true);
  }
  return ref;
}

TEST_P(Rules, DenseValuesFollowTheFormulas) {
  const TableDesc d = dense_desc(GetParam(), DT_PS_MODE_ASYNC, 13);
  Cluster c(d, 3, 1);
  const RefRow ref = push_dense_steps(c, d, 2, 7);
  EXPECT_EQ(c.pull_dense(0), ref.w);
}

// A range of more than 2^20 values is applied in two halves on two threads:
// the same values, and Adam's step counted once per push.
TEST_P(Rules, ALargeDenseRangeFollowsTheFormulas) {
  const TableDesc d = dense_desc(GetParam(), DT_PS_MODE_ASYNC, (uint64_t{1} << 20) + 3);
  Cluster c(d, 1, 1);
  const RefRow ref = push_dense_steps(c, d, 3, 3);
  const std::vector<float> got = c.pull_dense(0);
  ASSERT_EQ(got.size(), ref.w.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != ref.w[i];
  EXPECT_EQ(differ, 0u) << "values differ from the reference (first half and second half alike)";
}

// ASYNC: a push applied in ranges as its parts arrive (service.cc), in any
// order, gives the reference's values bit for bit, and a table pushed whole
// the same; Adam's step counted once per push. Shuffled ranges of uneven
// sizes, over two servers.
TEST_P(Rules, ADensePushInRangesInAnyOrderEqualsTheWholePush) {
  const TableDesc d = dense_desc(GetParam(), DT_PS_MODE_ASYNC, 1001);
  Cluster ranged(d, 2, 1), whole(d, 2, 1);
  std::mt19937_64 rng(4);
  RefRow ref = ref_new_row(d, 0, d.dim, true);
  for (int step = 0; step < 5; ++step) {
    const auto g = random_grads(rng, d.dim);
    whole.push_dense(0, g);
    ref_step(d, ref, g, true);
    for (int s = 0; s < 2; ++s) {
      Table& t = *ranged.servers[s];
      const uint64_t b = ranged.sh.dense_begin(d.dim, s), n = ranged.sh.dense_end(d.dim, s) - b;
      std::vector<std::pair<uint64_t, uint64_t>> spans;  // [offset, end)
      for (uint64_t off = 0; off < n;) {
        const uint64_t len = std::min<uint64_t>(n - off, 1 + rng() % 97);
        spans.emplace_back(off, off + len);
        off += len;
      }
      std::shuffle(spans.begin(), spans.end(), rng);
      const uint64_t push_step = t.begin_dense_push(0);
      for (auto [o, e] : spans) t.push_dense_range(push_step, o, g.data() + b + o, e - o);
      t.end_dense_push();
    }
  }
  EXPECT_EQ(ranged.pull_dense(0), ref.w);
  EXPECT_EQ(ranged.pull_dense(0), whole.pull_dense(0));
  EXPECT_EQ(ranged.servers[0]->stats().applied_steps, 5u);
  // Out of range, and SYNC tables (whole pushes only), are refused.
  Table& t0 = *ranged.servers[0];
  const uint64_t n0 = ranged.sh.dense_end(d.dim, 0);
  const float one = 1;
  EXPECT_NE(expect_error([&] { t0.push_dense_range(0, n0, &one, 1); }, DT_ERR_INVALID_USAGE).find("outside"),
            std::string::npos);
  Cluster sync(dense_desc(GetParam(), DT_PS_MODE_SYNC, 10), 1, 1);
  expect_error([&] { sync.servers[0]->begin_dense_push(0); }, DT_ERR_INVALID_USAGE);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Rules, testing::Values(DT_PS_OPT_SGD, DT_PS_OPT_ADAGRAD, DT_PS_OPT_ADAM),
                         [](const testing::TestParamInfo<int>& i) {
                           return std::string(i.param == 0 ? "sgd" : i.param == 1 ? "adagrad" : "adam");
                         });

TEST(Geo, ADensePushInRangesIsAddedAsItIs) {
  const TableDesc d = dense_desc(DT_PS_OPT_SGD, DT_PS_MODE_GEO, 7);
  Cluster c(d, 1, 2);
  const std::vector<float> before = c.pull_dense(0), g = {1, 2, 3, 4, 5, 6, 7};
  Table& t = *c.servers[0];
  const uint64_t step = t.begin_dense_push(1);
  t.push_dense_range(step, 4, g.data() + 4, 3);
  t.push_dense_range(step, 0, g.data(), 4);
  t.end_dense_push();
  const std::vector<float> after = c.pull_dense(0);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(after[i], before[i] + g[i]) << "value " << i;
}

TEST(Geo, PushesAreAddedAsTheyAre) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_GEO, 3);
  Cluster c(d, 2, 2, 4);
  const std::vector<uint64_t> keys = {5, 9};
  const std::vector<float> g = {1, 2, 3, 4, 5, 6};
  c.push(0, keys, g);
  c.push(1, keys, g);
  const auto got = c.pull(0, keys);
  for (size_t i = 0; i < 2; ++i)
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(got[i * 3 + j], ref_init(d, keys[i], j) + g[i * 3 + j] + g[i * 3 + j]);
  TableDesc dd = dense_desc(DT_PS_OPT_SGD, DT_PS_MODE_GEO, 4);
  Cluster cd(dd, 2, 1);
  cd.push_dense(0, {1, 2, 3, 4});
  const auto v = cd.pull_dense(0);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(v[i], ref_init(dd, i, 0) + float(i + 1));
  TableDesc adam = d;
  adam.optimizer = DT_PS_OPT_ADAM;
  const std::string msg = expect_error([&] { Table::create(adam, Sharding{}, 0, 1); }, DT_ERR_INVALID_USAGE);
  EXPECT_NE(msg.find("GEO"), std::string::npos) << msg;
}

// ---- sync mode ----

// Runs `workers` threads pushing fixed random gradients in sync mode; returns the final dump.

}  // namespace
}  // namespace dtrain::ps_grpc
