// The parameter server's table engine (plugins/ps_grpc/table.h) without gRPC:
// every rule against a reference computed here from backend_v1.h's formulas,
// sync determinism and timeouts, admission, eviction, save/load onto other
// server counts, damaged and interrupted saves, bad input, and the speed of
// a 64k-key pull and push (printed, not asserted).

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "dtrain/sdk/error.h"
#include "table.h"

namespace dtrain::ps_grpc {
namespace {

using sdk::TableDesc;

// ---- references, written from the ABI's comments and init.h's formulas ----

uint64_t ref_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
double ref_unit(uint64_t seed, uint64_t key, uint64_t j) {
  const uint64_t g = 0x9e3779b97f4a7c15ULL;
  const uint64_t st = ref_mix(key ^ ref_mix(seed + g));
  return static_cast<double>(ref_mix(st + (j + 1) * g) >> 11) / 9007199254740992.0;
}
float ref_init(const TableDesc& d, uint64_t key, uint64_t j) {
  if (d.initializer == DT_PS_INIT_CONSTANT) return static_cast<float>(d.init_a);
  if (d.initializer == DT_PS_INIT_UNIFORM)
    return static_cast<float>(d.init_a + (d.init_b - d.init_a) * ref_unit(d.seed, key, j));
  const double u1 = ref_unit(d.seed, key, 2 * j), u2 = ref_unit(d.seed, key, 2 * j + 1);
  return static_cast<float>(d.init_a + d.init_b * std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2 * M_PI * u2));
}

// One row (or a dense vector with per-value "rows" of 1) under a rule.
struct RefRow {
  std::vector<float> w, m, v;
  float g2 = 0;
  std::vector<float> g2v;  // dense adagrad
  uint64_t t = 0;
};
void ref_step(const TableDesc& d, RefRow& r, const std::vector<float>& g, bool dense) {
  const float lr = static_cast<float>(d.learning_rate), eps = static_cast<float>(d.epsilon);
  const size_t n = r.w.size();
  if (d.optimizer == DT_PS_OPT_SGD) {
    for (size_t i = 0; i < n; ++i) r.w[i] = r.w[i] - lr * g[i];
  } else if (d.optimizer == DT_PS_OPT_ADAGRAD) {
    if (dense) {
      for (size_t i = 0; i < n; ++i) {
        r.g2v[i] = r.g2v[i] + g[i] * g[i];
        r.w[i] = r.w[i] - lr * g[i] / (std::sqrt(r.g2v[i]) + eps);
      }
    } else {
      float sum = 0;
      for (size_t i = 0; i < n; ++i) sum = sum + g[i] * g[i];
      r.g2 = r.g2 + sum / static_cast<float>(n);
      for (size_t i = 0; i < n; ++i) r.w[i] = r.w[i] - lr * g[i] / (std::sqrt(r.g2) + eps);
    }
  } else {
    const float b1 = static_cast<float>(d.beta1), b2 = static_cast<float>(d.beta2);
    r.t += 1;
    const float c1 = static_cast<float>(1.0 - std::pow(d.beta1, static_cast<double>(r.t)));
    const float c2 = static_cast<float>(1.0 - std::pow(d.beta2, static_cast<double>(r.t)));
    for (size_t i = 0; i < n; ++i) {
      r.m[i] = b1 * r.m[i] + (1.0f - b1) * g[i];
      r.v[i] = b2 * r.v[i] + (1.0f - b2) * g[i] * g[i];
      r.w[i] = r.w[i] - lr * (r.m[i] / c1) / (std::sqrt(r.v[i] / c2) + eps);
    }
  }
}
RefRow ref_new_row(const TableDesc& d, uint64_t key, size_t n, bool dense) {
  RefRow r;
  r.w.resize(n);
  for (size_t i = 0; i < n; ++i) r.w[i] = dense ? ref_init(d, i, 0) : ref_init(d, key, i);
  r.m.assign(n, 0);
  r.v.assign(n, 0);
  r.g2 = static_cast<float>(d.initial_g2sum);
  r.g2v.assign(n, static_cast<float>(d.initial_g2sum));
  return r;
}

// ---- a tiny in-process "client": routes keys and dense ranges over servers ----

struct Cluster {
  TableDesc desc;
  Sharding sh;
  std::vector<std::unique_ptr<Table>> servers;
  Cluster(const TableDesc& d, int num_servers, int workers, uint32_t shards = 16) : desc(d) {
    sh.num_servers = num_servers;
    sh.num_shards = shards;
    for (int s = 0; s < num_servers; ++s) servers.push_back(Table::create(d, sh, s, workers));
  }
  static Clock::time_point soon(int ms = 5000) { return Clock::now() + std::chrono::milliseconds(ms); }
  std::vector<float> pull(int worker, const std::vector<uint64_t>& keys, int ms = 5000) {
    const uint64_t dim = desc.dim;
    std::vector<float> out(keys.size() * dim);
    for (int s = 0; s < sh.num_servers; ++s) {
      std::vector<uint64_t> k;
      std::vector<size_t> at;
      for (size_t i = 0; i < keys.size(); ++i)
        if (sh.server_of(keys[i]) == s) k.push_back(keys[i]), at.push_back(i);
      std::vector<float> o(k.size() * dim);
      servers[s]->pull_sparse(worker, k.data(), k.size(), o.data(), soon(ms));
      for (size_t j = 0; j < at.size(); ++j) std::copy_n(&o[j * dim], dim, &out[at[j] * dim]);
    }
    return out;
  }
  // Every server gets a push (empty ones too), so sync steps line up.
  void push(int worker, const std::vector<uint64_t>& keys, const std::vector<float>& g,
            const std::vector<float>* show_click = nullptr) {
    const uint64_t dim = desc.dim;
    for (int s = 0; s < sh.num_servers; ++s) {
      std::vector<uint64_t> k;
      std::vector<float> gg, sc;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (sh.server_of(keys[i]) != s) continue;
        k.push_back(keys[i]);
        gg.insert(gg.end(), &g[i * dim], &g[i * dim] + dim);
        if (show_click) sc.insert(sc.end(), &(*show_click)[2 * i], &(*show_click)[2 * i] + 2);
      }
      servers[s]->push_sparse(worker, k.data(), k.size(), gg.data(), show_click ? sc.data() : nullptr);
    }
  }
  std::vector<float> pull_dense(int worker, int ms = 5000) {
    std::vector<float> out(desc.dim);
    for (int s = 0; s < sh.num_servers; ++s) {
      const uint64_t b = sh.dense_begin(desc.dim, s), e = sh.dense_end(desc.dim, s);
      servers[s]->pull_dense(worker, out.data() + b, e - b, soon(ms));
    }
    return out;
  }
  void push_dense(int worker, const std::vector<float>& g) {
    for (int s = 0; s < sh.num_servers; ++s) {
      const uint64_t b = sh.dense_begin(desc.dim, s), e = sh.dense_end(desc.dim, s);
      servers[s]->push_dense(worker, g.data() + b, e - b);
    }
  }
  uint64_t shrink(uint32_t flags) {
    uint64_t n = 0;
    for (auto& t : servers) n += t->shrink(flags);
    return n;
  }
  uint64_t rows() const {
    uint64_t n = 0;
    for (auto& t : servers) n += t->stats().rows;
    return n;
  }
  void save(const std::string& dir, const std::string& gen, int mode, int format, bool manifest = true) {
    const std::string td = dir + "/" + desc.name;
    ::mkdir(dir.c_str(), 0755);
    ::mkdir(td.c_str(), 0755);
    Manifest m;
    m.table = desc.name;
    m.kind = desc.kind;
    m.dim = desc.dim;
    m.optimizer = desc.optimizer;
    m.mode = mode;
    m.format = format;
    m.num_servers = sh.num_servers;
    m.generation = gen;
    for (auto& t : servers)
      for (auto& f : t->save(td, gen, mode, format)) m.files.push_back(f);
    if (manifest) m.write(td);
  }
  void load(const std::string& dir) {
    for (auto& t : servers) t->load(dir + "/" + desc.name);
  }
};

std::string temp_dir() {
  std::string t = testing::TempDir() + "ps_table_XXXXXX";
  if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
  return t;
}

// Every line of a FULL text save of c, sorted: every row/value with its counters and state.
std::vector<std::string> dump(Cluster& c) {
  const std::string dir = temp_dir();
  c.save(dir, "dump", DT_PS_SAVE_FULL, DT_PS_FORMAT_TEXT);
  const Manifest m = Manifest::read(dir + "/" + c.desc.name);
  std::vector<std::string> lines;
  for (const auto& f : m.files) {
    std::ifstream in(dir + "/" + c.desc.name + "/" + f);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  if (c.desc.kind == DT_PS_TABLE_SPARSE) std::sort(lines.begin(), lines.end());
  return lines;
}

template <class F>
std::string expect_error(F&& f, dt_status_t status) {
  try {
    f();
  } catch (const sdk::Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TableDesc sparse_desc(int optimizer, int mode = DT_PS_MODE_ASYNC, uint64_t dim = 4) {
  TableDesc d;
  d.kind = DT_PS_TABLE_SPARSE;
  d.name = "emb";
  d.dim = dim;
  d.mode = mode;
  d.optimizer = optimizer;
  d.initializer = DT_PS_INIT_UNIFORM;
  d.init_a = -0.1;
  d.init_b = 0.1;
  d.seed = 7;
  d.learning_rate = 0.05;
  d.initial_g2sum = 0.1;
  return d;
}
TableDesc dense_desc(int optimizer, int mode = DT_PS_MODE_ASYNC, uint64_t dim = 10) {
  TableDesc d = sparse_desc(optimizer, mode, dim);
  d.kind = DT_PS_TABLE_DENSE;
  d.name = "fc";
  return d;
}

std::vector<float> random_grads(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> g(n);
  for (auto& x : g) x = u(rng);
  return g;
}

// ---- sharding and initializers ----

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

TEST_P(Rules, DenseValuesFollowTheFormulas) {
  const TableDesc d = dense_desc(GetParam(), DT_PS_MODE_ASYNC, 13);
  Cluster c(d, 3, 1);
  std::mt19937_64 rng(2);
  RefRow ref = ref_new_row(d, 0, d.dim, true);
  for (int step = 0; step < 7; ++step) {
    const auto g = random_grads(rng, d.dim);
    c.push_dense(0, g);
    ref_step(d, ref, g, true);
  }
  EXPECT_EQ(c.pull_dense(0), ref.w);
}

// A range of more than 2^20 values is applied in two halves on two threads:
// the same values, and Adam's step counted once per push.
TEST_P(Rules, ALargeDenseRangeFollowsTheFormulas) {
  const TableDesc d = dense_desc(GetParam(), DT_PS_MODE_ASYNC, (uint64_t{1} << 20) + 3);
  Cluster c(d, 1, 1);
  std::mt19937_64 rng(3);
  RefRow ref = ref_new_row(d, 0, d.dim, true);
  for (int step = 0; step < 3; ++step) {
    const auto g = random_grads(rng, d.dim);
    c.push_dense(0, g);
    ref_step(d, ref, g, true);
  }
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
std::vector<std::string> sync_run(const TableDesc& d, int servers, int workers, int steps) {
  Cluster c(d, servers, workers, 8);
  std::vector<std::thread> th;
  for (int w = 0; w < workers; ++w)
    th.emplace_back([&, w] {
      std::mt19937_64 rng(100 + w);
      for (int s = 0; s < steps; ++s) {
        if (d.kind == DT_PS_TABLE_DENSE) {
          c.push_dense(w, random_grads(rng, d.dim));
          c.pull_dense(w);
        } else {
          std::vector<uint64_t> keys;
          for (int i = 0; i < 50; ++i) keys.push_back(rng() % 80);
          c.push(w, keys, random_grads(rng, keys.size() * d.dim));
          c.pull(w, keys);
        }
      }
    });
  for (auto& t : th) t.join();
  return dump(c);
}

TEST(Sync, TwoRunsAreBitIdentical) {
  for (int opt : {DT_PS_OPT_ADAGRAD, DT_PS_OPT_ADAM}) {
    const TableDesc s = sparse_desc(opt, DT_PS_MODE_SYNC, 4), dn = dense_desc(opt, DT_PS_MODE_SYNC, 9);
    EXPECT_EQ(sync_run(s, 2, 3, 12), sync_run(s, 2, 3, 12));
    EXPECT_EQ(sync_run(dn, 2, 3, 12), sync_run(dn, 2, 3, 12));
  }
}

TEST(Sync, TwoWorkersEqualOneWorkerPushingTheAverage) {
  for (int opt : {DT_PS_OPT_SGD, DT_PS_OPT_ADAGRAD, DT_PS_OPT_ADAM}) {
    const TableDesc dd = dense_desc(opt, DT_PS_MODE_SYNC, 10);
    Cluster two(dd, 2, 2), one(dd, 2, 1);
    TableDesc sd = sparse_desc(opt, DT_PS_MODE_SYNC, 3);
    Cluster stwo(sd, 2, 2, 4), sone(sd, 2, 1, 4);
    std::mt19937_64 rng(3);
    for (int step = 0; step < 5; ++step) {
      const auto g0 = random_grads(rng, 10), g1 = random_grads(rng, 10);
      std::vector<float> avg(10);
      for (int i = 0; i < 10; ++i) avg[i] = (g0[i] + g1[i]) / 2.0f;
      two.push_dense(0, g0);
      two.push_dense(1, g1);
      one.push_dense(0, avg);
      // Sparse: worker 0 pushes keys {1, 2, 3}, worker 1 {2, 3, 4}: key 1 and 4 averaged with nothing.
      const auto s0 = random_grads(rng, 9), s1 = random_grads(rng, 9);
      stwo.push(0, {1, 2, 3}, s0);
      stwo.push(1, {2, 3, 4}, s1);
      std::vector<float> sa(12);
      for (int j = 0; j < 3; ++j) {
        sa[0 * 3 + j] = s0[0 * 3 + j] / 2.0f;
        sa[1 * 3 + j] = (s0[1 * 3 + j] + s1[0 * 3 + j]) / 2.0f;
        sa[2 * 3 + j] = (s0[2 * 3 + j] + s1[1 * 3 + j]) / 2.0f;
        sa[3 * 3 + j] = s1[2 * 3 + j] / 2.0f;
      }
      // One worker: key 2 and 3 each pushed once (the show counter then differs, the values do not).
      sone.push(0, {1, 2, 3, 4}, sa);
    }
    EXPECT_EQ(two.pull_dense(0), one.pull_dense(0)) << "optimizer " << opt;
    EXPECT_EQ(stwo.pull(1, {1, 2, 3, 4}), sone.pull(0, {1, 2, 3, 4})) << "optimizer " << opt;
  }
}

TEST(Sync, AStepIsTheWorkersSumInWorkerOrderOverNumWorkers) {
  for (int opt : {DT_PS_OPT_SGD, DT_PS_OPT_ADAM}) {
    // Sparse, 3 workers: key 1 pushed by workers 0 and 2 (twice by 2, summed first), key 2 by worker 1.
    const TableDesc d = sparse_desc(opt, DT_PS_MODE_SYNC, 2);
    Cluster c(d, 2, 3, 8);
    c.push(0, {1}, {0.5f, -0.25f});
    c.push(1, {2}, {1.0f, 2.0f});
    c.push(2, {1, 1}, {0.75f, 0.125f, 0.375f, 1.5f});
    RefRow r1 = ref_new_row(d, 1, 2, false), r2 = ref_new_row(d, 2, 2, false);
    ref_step(d, r1, {(0.5f + (0.75f + 0.375f)) / 3.0f, (-0.25f + (0.125f + 1.5f)) / 3.0f}, false);
    ref_step(d, r2, {1.0f / 3.0f, 2.0f / 3.0f}, false);
    const auto got = c.pull(0, {1, 2});
    EXPECT_EQ(got, (std::vector<float>{r1.w[0], r1.w[1], r2.w[0], r2.w[1]})) << "optimizer " << opt;
    // Dense, 3 workers.
    const TableDesc dd = dense_desc(opt, DT_PS_MODE_SYNC, 3);
    Cluster cd(dd, 2, 3);
    const std::vector<std::vector<float>> g = {{1, 2, 3}, {0.5f, -1, 0.25f}, {-2, 0.125f, 4}};
    for (int w = 0; w < 3; ++w) cd.push_dense(w, g[w]);
    RefRow rd = ref_new_row(dd, 0, 3, true);
    std::vector<float> avg(3);
    for (int i = 0; i < 3; ++i) avg[i] = (g[0][i] + g[1][i] + g[2][i]) / 3.0f;
    ref_step(dd, rd, avg, true);
    EXPECT_EQ(cd.pull_dense(1), rd.w) << "optimizer " << opt;
  }
}

TEST(Sync, PullWaitsForTheStepAndTimesOutNamingTheMissingWorkers) {
  const TableDesc d = dense_desc(DT_PS_OPT_SGD, DT_PS_MODE_SYNC, 4);
  Cluster c(d, 1, 3);
  const std::vector<float> g = {1, 1, 1, 1};
  c.push_dense(0, g);
  c.push_dense(1, g);
  c.push_dense(0, g);  // worker 0 is at step 2
  const std::string msg = expect_error([&] { c.pull_dense(0, 100); }, DT_ERR_TIMEOUT);
  EXPECT_NE(msg.find("table 'fc' sync step 1: waiting for worker(s) 2 that have not pushed it"), std::string::npos)
      << msg;
  EXPECT_EQ(c.pull_dense(2, 100), c.pull_dense(2, 100)) << "worker 2 pushed nothing: no wait";
  // Worker 2 pushes from another thread while worker 0 waits.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.push_dense(2, g);
    c.push_dense(1, g);
    c.push_dense(2, g);
  });
  const auto v = c.pull_dense(0, 5000);
  late.join();
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(v[i], ref_init(d, i, 0) - 0.05f * 1.0f - 0.05f * 1.0f);
  EXPECT_EQ(c.servers[0]->stats().applied_steps, 2u);
  // Sparse, two missing workers.
  Cluster s(sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_SYNC, 2), 1, 3);
  s.push(0, {1}, {1, 1});
  const std::string m2 = expect_error([&] { s.pull(0, {1}, 50); }, DT_ERR_TIMEOUT);
  EXPECT_NE(m2.find("table 'emb' sync step 1: waiting for worker(s) 1, 2 that have not pushed it"), std::string::npos)
      << m2;
}

// ---- admission and eviction ----

TEST(Admission, ByCountCreatesTheRowAtTheNthPush) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 2);
  d.admit_count = 3;
  Cluster c(d, 1, 1);
  const std::vector<float> g = {1, 1};
  const float w0 = ref_init(d, 42, 0);
  c.push(0, {42}, g);
  c.push(0, {42, 42}, {1, 1, 1, 1});  // one push, however many times the key repeats in it
  EXPECT_EQ(c.rows(), 0u);
  EXPECT_EQ(c.servers[0]->stats().pending, 1u);
  EXPECT_EQ(c.pull(0, {42})[0], w0) << "counted, not applied";
  c.push(0, {42}, g);
  EXPECT_EQ(c.rows(), 1u);
  EXPECT_EQ(c.servers[0]->stats().pending, 0u);
  EXPECT_EQ(c.pull(0, {42})[0], w0 - 0.05f * 1.0f) << "the admitting push is applied";
}

TEST(Admission, ByProbabilityDecidedByAHashOfSeedAndKey) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 1);
  d.admit_probability = 0.3;
  std::vector<uint64_t> keys(4000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 104729;
  const std::vector<float> g(keys.size(), 1.0f);
  Cluster a(d, 1, 1), b(d, 3, 1, 9);
  a.push(0, keys, g);
  b.push(0, keys, g);
  const auto va = a.pull(0, keys), vb = b.pull(0, keys);
  EXPECT_EQ(va, vb) << "the same keys admitted on any server count";
  size_t admitted = 0;
  for (size_t i = 0; i < keys.size(); ++i) admitted += va[i] != ref_init(d, keys[i], 0);
  EXPECT_EQ(admitted, a.rows());
  EXPECT_NEAR(static_cast<double>(admitted) / keys.size(), 0.3, 0.03);
  d.admit_probability = 0.0;
  Cluster none(d, 1, 1);
  none.push(0, keys, g);
  EXPECT_EQ(none.rows(), 0u);
  EXPECT_EQ(none.servers[0]->stats().pending, 0u) << "a refused key is not even counted";
}

TEST(Shrink, DecaysThenDeletesByScore) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 2);
  d.decay_rate = 0.5;
  d.nonclk_coeff = 0.1;
  d.click_coeff = 1.0;
  d.delete_threshold = 0.6;
  Cluster c(d, 2, 1, 8);
  // show, click: key 1 (10, 0) -> 5,0 -> score 0.5 deleted; key 2 (10, 2) -> 5,1 -> 0.4 + 1 kept;
  // key 3 (20, 0) -> 10,0 -> 1.0 kept; key 4 (1, 1) -> 0.5, 0.5 -> 0.5 deleted.
  const std::vector<float> sc = {10, 0, 10, 2, 20, 0, 1, 1};
  c.push(0, {1, 2, 3, 4}, std::vector<float>(8, 0.0f), &sc);
  EXPECT_EQ(c.shrink(0), 2u);
  EXPECT_EQ(c.rows(), 2u);
  std::set<uint64_t> left;
  for (const auto& l : dump(c)) left.insert(std::stoull(l.substr(0, l.find(' '))));
  EXPECT_EQ(left, (std::set<uint64_t>{2, 3}));
  // Second shrink: key 2 -> 2.5, 0.5 -> 0.2 + 0.5 = 0.7 kept; key 3 -> 5 -> 0.5 deleted.
  EXPECT_EQ(c.shrink(0), 1u);
  EXPECT_EQ(c.rows(), 1u);
}

TEST(Shrink, DeletesRowsUnseenForMoreThanTheDays) {
  TableDesc d = sparse_desc(DT_PS_OPT_ADAM, DT_PS_MODE_ASYNC, 3);
  d.delete_after_unseen_days = 2;
  d.delete_threshold = -1;  // never by score
  Cluster c(d, 2, 1, 16);
  std::vector<uint64_t> old_keys, new_keys;
  for (uint64_t k = 0; k < 300; ++k) (k % 3 ? old_keys : new_keys).push_back(k);
  c.push(0, old_keys, std::vector<float>(old_keys.size() * 3, 0.5f));
  c.push(0, new_keys, std::vector<float>(new_keys.size() * 3, 0.5f));
  EXPECT_EQ(c.shrink(DT_PS_SHRINK_NEW_DAY), 0u);                       // day 1
  EXPECT_EQ(c.shrink(DT_PS_SHRINK_NEW_DAY), 0u);                       // day 2: unseen 2, not more than 2
  c.push(0, new_keys, std::vector<float>(new_keys.size() * 3, 0.5f));  // resets their age
  const auto before = c.pull(0, new_keys);
  EXPECT_EQ(c.shrink(DT_PS_SHRINK_NEW_DAY), old_keys.size());
  EXPECT_EQ(c.rows(), new_keys.size());
  EXPECT_EQ(c.pull(0, new_keys), before) << "rows moved inside the arena keep their values";
  EXPECT_EQ(c.pull(0, old_keys), Cluster(d, 1, 1).pull(0, old_keys)) << "deleted rows pull as initial";
}

// ---- save and load ----

Cluster trained(const TableDesc& d, int servers, std::mt19937_64& rng, int steps = 5) {
  Cluster c(d, servers, 1, 16);
  for (int s = 0; s < steps; ++s) {
    if (d.kind == DT_PS_TABLE_DENSE) {
      c.push_dense(0, random_grads(rng, d.dim));
      continue;
    }
    std::vector<uint64_t> keys;
    for (int i = 0; i < 200; ++i) keys.push_back(rng() % 1000 * 0x100000001ull);
    std::vector<float> sc(keys.size() * 2);
    for (size_t i = 0; i < keys.size(); ++i) sc[2 * i] = float(i % 5), sc[2 * i + 1] = float(i % 2);
    c.push(0, keys, random_grads(rng, keys.size() * d.dim), &sc);
  }
  if (d.kind == DT_PS_TABLE_SPARSE) c.shrink(DT_PS_SHRINK_NEW_DAY);  // unseen_days 1 everywhere
  return c;
}

TEST(SaveLoad, FullSaveLoadsOntoOneTwoAndThreeServersExactly) {
  for (int format : {DT_PS_FORMAT_BINARY, DT_PS_FORMAT_TEXT})
    for (int opt : {DT_PS_OPT_SGD, DT_PS_OPT_ADAGRAD, DT_PS_OPT_ADAM})
      for (bool sparse : {true, false}) {
        SCOPED_TRACE(std::string(sparse ? "sparse " : "dense ") + std::to_string(opt) + " format " +
                     std::to_string(format));
        const TableDesc d = sparse ? sparse_desc(opt, DT_PS_MODE_ASYNC, 5) : dense_desc(opt, DT_PS_MODE_ASYNC, 23);
        std::mt19937_64 rng(11);
        Cluster src = trained(d, 2, rng);
        const std::string dir = temp_dir();
        src.save(dir, "g1", DT_PS_SAVE_FULL, format);
        const auto want = dump(src);
        ASSERT_FALSE(want.empty());
        for (int servers : {1, 2, 3}) {
          Cluster dst(d, servers, 1, servers == 2 ? 16 : 7);
          dst.load(dir);
          ASSERT_EQ(dump(dst), want) << servers << " servers";
          // The state is live: one more step gives the same values on both.
          std::mt19937_64 r2(99);
          if (sparse) {
            const std::vector<uint64_t> keys = {0, 0x100000001ull * 3, 0x100000001ull * 999};
            const auto g = random_grads(r2, keys.size() * d.dim);
            Cluster again(d, 2, 1, 16);
            again.load(dir);
            again.push(0, keys, g);
            dst.push(0, keys, g);
            ASSERT_EQ(dst.pull(0, keys), again.pull(0, keys));
          } else {
            const auto g = random_grads(r2, d.dim);
            Cluster again(d, 1, 1);
            again.load(dir);
            again.push_dense(0, g);
            dst.push_dense(0, g);
            ASSERT_EQ(dst.pull_dense(0), again.pull_dense(0));
          }
        }
      }
}

TEST(SaveLoad, BasePlusDeltaRestoresTheLatestValues) {
  for (int format : {DT_PS_FORMAT_BINARY, DT_PS_FORMAT_TEXT}) {
    const TableDesc d = sparse_desc(DT_PS_OPT_ADAGRAD, DT_PS_MODE_ASYNC, 4);
    std::mt19937_64 rng(5);
    Cluster src = trained(d, 2, rng);
    const std::string base = temp_dir(), delta = temp_dir();
    src.save(base, "b", DT_PS_SAVE_BASE, format);
    const std::vector<uint64_t> changed = {1ull << 40, 0x100000001ull * 7, 12345};
    src.push(0, changed, random_grads(rng, changed.size() * d.dim));
    src.save(delta, "d", DT_PS_SAVE_DELTA, format);
    const Manifest dm = Manifest::read(delta + "/emb");
    EXPECT_EQ(dm.mode, DT_PS_SAVE_DELTA);
    if (format == DT_PS_FORMAT_TEXT) {
      size_t lines = 0;
      for (const auto& f : dm.files) {
        std::ifstream in(delta + "/emb/" + f);
        for (std::string l; std::getline(in, l);) ++lines;
      }
      EXPECT_EQ(lines, changed.size()) << "a delta holds only the rows changed since the base";
    }
    std::vector<uint64_t> keys = changed;
    for (uint64_t k = 0; k < 1000; ++k) keys.push_back(k * 0x100000001ull);
    Cluster dst(d, 3, 1, 16);
    dst.load(base);
    dst.load(delta);
    EXPECT_EQ(dst.pull(0, keys), src.pull(0, keys));
    EXPECT_EQ(dst.rows(), src.rows());
    // A second delta with nothing changed is empty.
    const std::string empty = temp_dir();
    src.save(empty, "e", DT_PS_SAVE_DELTA, format);
    Cluster probe(d, 1, 1);
    probe.load(empty);
    EXPECT_EQ(probe.rows(), 0u);
  }
}

TEST(SaveLoad, TruncatedPartOrMissingManifestIsAClearErrorAndChangesNothing) {
  const TableDesc d = sparse_desc(DT_PS_OPT_ADAM, DT_PS_MODE_ASYNC, 4);
  std::mt19937_64 rng(8);
  Cluster src = trained(d, 2, rng);
  const std::string dir = temp_dir();
  src.save(dir, "g1", DT_PS_SAVE_FULL, DT_PS_FORMAT_BINARY);
  Cluster dst(d, 1, 1);
  dst.push(0, {3}, {1, 2, 3, 4});
  const auto before = dump(dst);
  const Manifest m = Manifest::read(dir + "/emb");
  const std::string part = dir + "/emb/" + m.files[1];
  struct stat st {};
  ASSERT_EQ(::stat(part.c_str(), &st), 0);
  ASSERT_EQ(::truncate(part.c_str(), st.st_size - 13), 0);
  std::string msg = expect_error([&] { dst.load(dir); }, DT_ERR_SYSTEM);
  EXPECT_NE(msg.find(part), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_EQ(dump(dst), before);

  ::unlink((dir + "/emb/MANIFEST").c_str());
  msg = expect_error([&] { dst.load(dir); }, DT_ERR_SYSTEM);
  EXPECT_NE(msg.find(dir + "/emb/MANIFEST does not exist"), std::string::npos) << msg;

  // A damaged manifest names its line; a dim mismatch names the field.
  {
    std::ofstream out(dir + "/emb/MANIFEST");
    out << "version = 1\ntable = emb\nkind = sparse\ndim = four\n";
  }
  msg = expect_error([&] { dst.load(dir); }, DT_ERR_SYSTEM);
  EXPECT_NE(msg.find("MANIFEST:4"), std::string::npos) << msg;
  const std::string ok = temp_dir();
  src.save(ok, "g2", DT_PS_SAVE_FULL, DT_PS_FORMAT_TEXT);
  TableDesc wide = d;
  wide.dim = 8;
  Cluster other(wide, 1, 1);
  msg = expect_error([&] { other.load(ok); }, DT_ERR_INVALID_USAGE);
  EXPECT_NE(msg.find("dim is 4"), std::string::npos) << msg;
  TableDesc sgd = d;
  sgd.optimizer = DT_PS_OPT_SGD;
  Cluster plain(sgd, 1, 1);
  msg = expect_error([&] { plain.load(ok); }, DT_ERR_INVALID_USAGE);
  EXPECT_NE(msg.find("optimizer is adam"), std::string::npos) << msg;
  // A text part with a short line names the file and the line.
  const Manifest tm = Manifest::read(ok + "/emb");
  { std::ofstream(ok + "/emb/" + tm.files[0], std::ios::app) << "17 0.5 0.25\n"; }
  msg = expect_error([&] { dst.load(ok); }, DT_ERR_SYSTEM);
  EXPECT_NE(msg.find(tm.files[0] + " line "), std::string::npos) << msg;
  EXPECT_NE(msg.find("found 3"), std::string::npos) << msg;
  EXPECT_EQ(dump(dst), before);
}

TEST(SaveLoad, AnInterruptedSaveLeavesThePreviousOneLoadable) {
  for (bool sparse : {true, false}) {
    const TableDesc d = sparse ? sparse_desc(DT_PS_OPT_ADAM, DT_PS_MODE_ASYNC, 4) : dense_desc(DT_PS_OPT_ADAM);
    std::mt19937_64 rng(9);
    Cluster src = trained(d, 2, rng);
    const std::string dir = temp_dir();
    src.save(dir, "g1", DT_PS_SAVE_FULL, DT_PS_FORMAT_BINARY);
    const auto first = dump(src);
    std::mt19937_64 more(10);
    Cluster changed = trained(d, 2, more, 3);
    changed.save(dir, "g2", DT_PS_SAVE_FULL, DT_PS_FORMAT_BINARY, /*manifest=*/false);  // killed before the manifest
    Cluster dst(d, 3, 1, 16);
    dst.load(dir);
    EXPECT_EQ(dump(dst), first);
    // The next complete save replaces it and removes the unlisted parts.
    changed.save(dir, "g3", DT_PS_SAVE_FULL, DT_PS_FORMAT_BINARY);
    size_t parts = 0;
    for (auto f : {"g1", "g2", "g3"})
      for (int s = 0; s < 2; ++s)
        parts +=
            ::access((dir + "/" + d.name + "/part-" + f + "-" + std::to_string(s) + "-of-2.bin").c_str(), F_OK) == 0;
    EXPECT_EQ(parts, 2u);
    Cluster dst2(d, 1, 1);
    dst2.load(dir);
    EXPECT_EQ(dump(dst2), dump(changed));
  }
}

// ---- bad input ----

TEST(BadInput, WrongCountsKeysWorkersAndDescriptorsAreRefusedNamingTheNumbers) {
  const TableDesc dd = dense_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 10);
  Cluster c(dd, 3, 2);
  std::vector<float> buf(100, 1.0f);
  std::string msg = expect_error([&] { c.servers[1]->push_dense(0, buf.data(), 4); }, DT_ERR_INVALID_USAGE);
  EXPECT_NE(msg.find("table 'fc': dense push of 4 values, but server 1 holds 3 (values [4, 7) of dim 10)"),
            std::string::npos)
      << msg;
  msg = expect_error([&] { c.servers[0]->pull_dense(2, buf.data(), 4, Clock::now()); }, DT_ERR_INVALID_USAGE);
  EXPECT_NE(msg.find("worker 2 is out of range"), std::string::npos) << msg;
  const auto v = c.pull_dense(0);
  EXPECT_EQ(v[0], ref_init(dd, 0, 0)) << "a refused push changes nothing";

  Cluster s(sparse_desc(DT_PS_OPT_SGD), 2, 1, 8);
  uint64_t foreign = 0, mine = 0;
  while (s.sh.server_of(foreign) != 1) ++foreign;
  while (s.sh.server_of(mine) != 0) ++mine;
  const uint64_t keys[2] = {mine, foreign};
  msg = expect_error([&] { s.servers[0]->push_sparse(0, keys, 2, buf.data(), nullptr); }, DT_ERR_INVALID_USAGE);
  EXPECT_NE(msg.find("key " + std::to_string(foreign)), std::string::npos) << msg;
  EXPECT_NE(msg.find("belongs to server 1, not to server 0"), std::string::npos) << msg;
  EXPECT_EQ(s.rows(), 0u) << "nothing applied, not even the first key";
  expect_error([&] { s.servers[0]->pull_dense(0, buf.data(), 4, Clock::now()); }, DT_ERR_INVALID_USAGE);
  expect_error([&] { c.servers[0]->shrink(0); }, DT_ERR_INVALID_USAGE);

  TableDesc other = sparse_desc(DT_PS_OPT_SGD);
  other.dim = 16;
  EXPECT_EQ(s.servers[0]->differs(other), "dim is 4 here and 16 in the request");
  EXPECT_EQ(s.servers[0]->differs(sparse_desc(DT_PS_OPT_SGD)), "");
  TableDesc zero = other;
  zero.dim = 0;
  msg = expect_error([&] { Table::create(zero, Sharding{}, 0, 1); }, DT_ERR_INVALID_USAGE);
  EXPECT_NE(msg.find("table 'emb': dim is 0"), std::string::npos) << msg;
}

// ---- concurrency and speed ----

TEST(Concurrency, ManyThreadsPushingAndPullingLoseNoUpdate) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 2);
  d.initializer = DT_PS_INIT_CONSTANT;
  d.init_a = 0;
  d.learning_rate = 1.0;
  Cluster c(d, 1, 4, 16);
  std::vector<std::thread> th;
  for (int w = 0; w < 4; ++w)
    th.emplace_back([&, w] {
      std::mt19937_64 rng(w);
      for (int i = 0; i < 200; ++i) {
        std::vector<uint64_t> keys;
        for (int k = 0; k < 64; ++k) keys.push_back(rng() % 500);
        c.push(w, keys, std::vector<float>(keys.size() * 2, -1.0f));  // exact in f32 in any order
        if (i % 10 == 0) c.pull(w, keys);
        if (w == 0 && i % 50 == 0) c.shrink(0);  // deletes nothing (score >= 0 > -inf)
      }
    });
  for (auto& t : th) t.join();
  std::vector<uint64_t> all(500);
  for (uint64_t k = 0; k < 500; ++k) all[k] = k;
  const auto v = c.pull(0, all);
  double total = 0;
  for (uint64_t k = 0; k < 500; ++k) total += v[2 * k];
  EXPECT_EQ(total, 4.0 * 200 * 64);
}

// A dense push's parts (calls on their own server threads) apply their
// ranges at once, blocks crossing the table's lock stripes, beside a pull:
// every value applied exactly once (SGD with lr 1 and gradients -1: whole
// numbers, 0 to 5 while the pushes run, 5 after). Under ThreadSanitizer this
// checks the stripes' locking against the pull.
TEST(Concurrency, ADensePushsPartsApplySideBySideBesideAPull) {
  TableDesc d = dense_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 300007);
  d.initializer = DT_PS_INIT_CONSTANT;
  d.init_a = 0;
  d.learning_rate = 1.0;
  Cluster c(d, 1, 1);
  Table& t = *c.servers[0];
  const uint64_t n = d.dim, parts = 4, block = 8192;
  const std::vector<float> g(n, -1.0f);
  std::atomic<bool> done{false};
  std::thread puller([&] {
    while (!done.load()) {
      for (float v : c.pull_dense(0)) ASSERT_TRUE(v >= 0 && v <= 5 && v == static_cast<float>(static_cast<int>(v)));
    }
  });
  for (int push = 0; push < 5; ++push) {
    const uint64_t step = t.begin_dense_push(0);
    std::vector<std::thread> th;
    for (uint64_t p = 0; p < parts; ++p)
      th.emplace_back([&, p] {
        for (uint64_t off = n * p / parts, pe = n * (p + 1) / parts; off < pe; off += block)
          t.push_dense_range(step, off, g.data() + off, std::min(block, pe - off));
      });
    for (auto& x : th) x.join();
    t.end_dense_push();
  }
  done = true;
  puller.join();
  const auto w = c.pull_dense(0);
  EXPECT_EQ(std::count(w.begin(), w.end(), 5.0f), static_cast<ptrdiff_t>(n));
  EXPECT_EQ(t.stats().applied_steps, 5u);
}

TEST(Concurrency, AHugeCallThenSmallOnesOnTheSameThread) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 1);
  d.learning_rate = 1.0;
  Cluster c(d, 1, 1, 64);
  std::vector<uint64_t> keys((1u << 20) + 5);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i % 1000000;  // repeats: the summing path
  Table& t = *c.servers[0];
  t.push_sparse(0, keys.data(), keys.size(), std::vector<float>(keys.size(), -1.0f).data(), nullptr);
  EXPECT_EQ(t.stats().rows, 1000000u);
  const std::vector<uint64_t> few = {0, 5, 999999};
  const auto v = c.pull(0, few);
  for (size_t i = 0; i < few.size(); ++i) EXPECT_EQ(v[i], ref_init(d, few[i], 0) + (few[i] < 48581 ? 2.0f : 1.0f));
}

TEST(Speed, PullAndPushOf64kKeysDim8) {
  TableDesc d = sparse_desc(DT_PS_OPT_SGD, DT_PS_MODE_ASYNC, 8);
  Cluster c(d, 1, 1, 64);
  std::mt19937_64 rng(12);
  std::vector<uint64_t> keys(65536);
  for (auto& k : keys) k = rng();
  const auto g = random_grads(rng, keys.size() * 8);
  std::vector<float> out(keys.size() * 8);
  Table& t = *c.servers[0];
  t.push_sparse(0, keys.data(), keys.size(), g.data(), nullptr);  // creates the rows
  auto time = [&](const std::function<void()>& f) {
    f();
    const int reps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / reps / keys.size();
  };
  const double pull = time([&] { t.pull_sparse(0, keys.data(), keys.size(), out.data(), Clock::now()); });
  // As in the server: each call's transport traffic (2.5 MB for this pull)
  // passes through the caches between two lookups. Only the pull is timed.
  std::vector<char> from(5 << 19, 1), to(from.size());
  std::vector<double> cold;
  for (int i = 0; i < 21; ++i) {
    std::memcpy(to.data(), from.data(), from.size());
    from[static_cast<size_t>(i) * 4096] ^= to[7];
    const auto t0 = std::chrono::steady_clock::now();
    t.pull_sparse(0, keys.data(), keys.size(), out.data(), Clock::now());
    cold.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                   keys.size());
  }
  std::sort(cold.begin(), cold.end());
  const double pull_cold = cold[cold.size() / 2];
  const double push = time([&] { t.push_sparse(0, keys.data(), keys.size(), g.data(), nullptr); });
  TableDesc ad = d;
  ad.optimizer = DT_PS_OPT_ADAM;
  Cluster ca(ad, 1, 1, 64);
  Table& ta = *ca.servers[0];
  ta.push_sparse(0, keys.data(), keys.size(), g.data(), nullptr);
  const double push_adam = time([&] { ta.push_sparse(0, keys.data(), keys.size(), g.data(), nullptr); });
  std::printf(
      "[ps_table speed] 65536 keys x dim 8, 1 thread: pull %.1f ns/key (after 2.5 MB of other traffic: %.1f, "
      "median of 21), push (sgd) %.1f ns/key, push (adam) %.1f ns/key\n",
      pull, pull_cold, push, push_adam);
  EXPECT_EQ(t.stats().rows, keys.size());
}

}  // namespace
}  // namespace dtrain::ps_grpc
