// The table engine's SYNC mode (engine/sync_steps.h): runs are bit-identical,
// a step is the workers' sum in worker order over their number, and a pull
// waits for its step or times out naming the workers that have not pushed.

#include "ps_table_util.h"

namespace dtrain::ps_grpc {
namespace {

using namespace table_test;  // NOLINT(build/namespaces)

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

}  // namespace
}  // namespace dtrain::ps_grpc
