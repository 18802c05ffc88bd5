// The table engine's calls under stress: bad input refused naming the
// numbers, many threads pushing and pulling, a dense push's parts beside a
// pull, and the speed of a 64k-key pull and push (printed, not asserted).

#include "ps_table_util.h"

namespace dtrain::ps_grpc {
namespace {

using namespace table_test;  // NOLINT(build/namespaces)

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
