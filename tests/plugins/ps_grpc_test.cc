// The ps_grpc plugin through its C table (dt_backend_v1_t), loaded with the
// core's PluginRegistry: servers and workers are communicators in this
// process, rendezvous through a MemoryStore, traffic over real gRPC on
// loopback. Values are checked against sums computed here. The plugin's
// failures (refusals, dead servers, timeouts) are in ps_grpc_failure_test.cc.

#include "ps_grpc_util.h"

namespace {

using namespace ps_grpc_test;  // NOLINT(build/namespaces)

TEST_F(PsGrpc, PluginDeclaresPsCapabilities) {
  EXPECT_STREQ(be->name, "ps_grpc");
  EXPECT_GE(be->abi_minor, 1u);  // the PS slots came with minor 1
  uint64_t want = DT_CAP_PS_DENSE | DT_CAP_PS_SPARSE | DT_CAP_PS_SERVER | DT_CAP_CPU_BUFFERS;
  EXPECT_EQ(be->caps & want, want);
  EXPECT_EQ(be->caps & DT_CAP_ALLREDUCE, 0u);
}

// 2 servers x 2 workers, small chunks (so every request is split), async SGD
// with learning rate 1: every value is its initial value minus the sum of
// every gradient pushed to it.
TEST_F(PsGrpc, TwoServersTwoWorkersDenseAndSparse) {
  const std::string cfg = "chunk_bytes = 4096\nshard_num = 16\n";
  dt_comm_h s0 = create(DT_ROLE_SERVER, 0, 2, 2, "job-secret", cfg);
  dt_comm_h s1 = create(DT_ROLE_SERVER, 1, 2, 2, "job-secret", cfg);
  ASSERT_TRUE(s0 && s1) << last_error;
  dt_comm_h w[2] = {create(DT_ROLE_WORKER, 0, 2, 2, "job-secret", cfg),
                    create(DT_ROLE_WORKER, 1, 2, 2, "job-secret", cfg)};
  ASSERT_TRUE(w[0] && w[1]) << last_error;

  const uint64_t dense_dim = 5001, dim = 8;
  auto dd = desc("dense_w", DT_PS_TABLE_DENSE, dense_dim);
  auto sd = desc("emb", DT_PS_TABLE_SPARSE, dim);
  uint32_t dense_id[2], sparse_id[2];
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK(declare(w[i], dd, &dense_id[i]));
    ASSERT_OK(declare(w[i], sd, &sparse_id[i]));
  }

  // Keys: unsorted, repeated within a push, some never pushed (pulled as initial values).
  std::mt19937_64 rng(42);
  std::vector<uint64_t> keys(3000);
  for (auto& k : keys) k = rng() % 100000;
  keys[10] = keys[20];
  std::vector<double> dense_sum(dense_dim, 0.0);
  std::map<uint64_t, std::vector<double>> sparse_sum;
  auto worker = [&](int r) {
    std::vector<float> g(dense_dim);
    for (uint64_t i = 0; i < dense_dim; ++i) g[i] = 0.25f * static_cast<float>((r + 1) * (i % 7));
    Result a = push_dense(w[r], dense_id[r], g);
    std::vector<uint64_t> mine(keys.begin() + r * 1000, keys.begin() + r * 1000 + 2000);
    std::vector<float> sg(mine.size() * dim);
    for (size_t i = 0; i < sg.size(); ++i) sg[i] = 0.125f * static_cast<float>((r + 1) * (i % 5));
    Result b = push_sparse(w[r], sparse_id[r], mine, sg);
    return std::make_pair(a, b);
  };
  for (int r = 0; r < 2; ++r) {
    for (uint64_t i = 0; i < dense_dim; ++i) dense_sum[i] += 0.25 * (r + 1) * (i % 7);
    for (size_t j = 0; j < 2000; ++j) {
      auto& row = sparse_sum[keys[r * 1000 + j]];
      row.resize(dim, 0.0);
      for (uint64_t d = 0; d < dim; ++d) row[d] += 0.125 * (r + 1) * ((j * dim + d) % 5);
    }
  }
  std::pair<Result, Result> res[2];
  std::thread t1([&] { res[1] = worker(1); });
  res[0] = worker(0);
  t1.join();
  for (auto& r : res) {
    EXPECT_OK(r.first);
    EXPECT_OK(r.second);
  }
  std::thread tb([&] { EXPECT_OK(barrier(w[1])); });
  EXPECT_OK(barrier(w[0]));
  tb.join();

  std::vector<uint64_t> probe = keys;
  for (int i = 0; i < 50; ++i) probe.push_back(200000 + i);  // never pushed
  for (int r = 0; r < 2; ++r) {
    std::vector<float> v(dense_dim, -1.0f);
    ASSERT_OK(pull_dense(w[r], dense_id[r], v));
    for (uint64_t i = 0; i < dense_dim; ++i)
      ASSERT_FLOAT_EQ(v[i], static_cast<float>(0.5 - dense_sum[i])) << "dense value " << i;
    std::vector<float> sv(probe.size() * dim, -1.0f);
    ASSERT_OK(pull_sparse(w[r], sparse_id[r], probe, sv));
    for (size_t i = 0; i < probe.size(); ++i) {
      auto it = sparse_sum.find(probe[i]);
      for (uint64_t d = 0; d < dim; ++d) {
        double want = 0.5 - (it == sparse_sum.end() ? 0.0 : it->second[d]);
        ASSERT_NEAR(sv[i * dim + d], want, 1e-4) << "key " << probe[i] << " at position " << i << " value " << d;
      }
    }
  }

  // Serving ends when both workers have finished.
  auto o = opts();
  dt_work_h serve0 = nullptr, serve1 = nullptr;
  ASSERT_EQ(be->ps_serve(s0, &o, &serve0), DT_OK);
  ASSERT_EQ(be->ps_serve(s1, &o, &serve1), DT_OK);
  EXPECT_OK(finish_worker(w[0]));
  EXPECT_EQ(be->work_test(serve0), DT_IN_PROGRESS);
  EXPECT_OK(finish_worker(w[1]));
  EXPECT_EQ(be->work_wait(serve0, 5000), DT_OK);
  EXPECT_EQ(be->work_wait(serve1, 5000), DT_OK);
  be->work_release(serve0);
  be->work_release(serve1);
}

TEST_F(PsGrpc, StopEndsServing) {
  dt_comm_h s = create(DT_ROLE_SERVER, 0, 1, 1);
  ASSERT_TRUE(s) << last_error;
  auto o = opts();
  dt_work_h serve = nullptr;
  ASSERT_EQ(be->ps_serve(s, &o, &serve), DT_OK);
  EXPECT_EQ(be->work_wait(serve, 50), DT_IN_PROGRESS);
  std::thread t([&] { be->ps_stop(s, "the launcher says so"); });
  EXPECT_EQ(be->work_wait(serve, 5000), DT_OK);
  t.join();
  be->work_release(serve);
}

TEST_F(PsGrpc, SaveOnTwoServersLoadOntoThree) {
  std::string dir = ::testing::TempDir() + "ps_grpc_save_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const uint64_t dim = 4, dense_dim = 101;
  std::vector<uint64_t> keys(500);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 104729 + 3;
  auto sd = desc("emb", DT_PS_TABLE_SPARSE, dim);
  sd.optimizer = DT_PS_OPT_ADAM;
  sd.learning_rate = 0.01;
  sd.beta1 = 0.9;
  sd.beta2 = 0.999;
  sd.epsilon = 1e-8;
  auto dd = desc("dense_w", DT_PS_TABLE_DENSE, dense_dim);
  std::vector<float> sparse_before(keys.size() * dim), dense_before(dense_dim);
  {
    ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 2, 1) && create(DT_ROLE_SERVER, 1, 2, 1)) << last_error;
    dt_comm_h w = create(DT_ROLE_WORKER, 0, 2, 1);
    ASSERT_TRUE(w) << last_error;
    uint32_t sid = 0, did = 0;
    ASSERT_OK(declare(w, sd, &sid));
    ASSERT_OK(declare(w, dd, &did));
    std::vector<float> g(keys.size() * dim), dg(dense_dim);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
    for (size_t i = 0; i < dg.size(); ++i) dg[i] = 0.5f * static_cast<float>(i % 3);
    for (int step = 0; step < 3; ++step) {
      ASSERT_OK(push_sparse(w, sid, keys, g));
      ASSERT_OK(push_dense(w, did, dg));
    }
    ASSERT_OK(pull_sparse(w, sid, keys, sparse_before));
    ASSERT_OK(pull_dense(w, did, dense_before));
    ASSERT_OK(save(w, sid, dir, DT_PS_SAVE_FULL, DT_PS_FORMAT_BINARY));
    ASSERT_OK(save(w, did, dir, DT_PS_SAVE_FULL, DT_PS_FORMAT_TEXT));
    EXPECT_TRUE(std::filesystem::exists(dir + "/emb/MANIFEST"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/dense_w/MANIFEST"));
    for (auto* c : std::vector<dt_comm_h>(comms)) destroy(c);
  }
  ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 3, 1) && create(DT_ROLE_SERVER, 1, 3, 1) && create(DT_ROLE_SERVER, 2, 3, 1))
      << last_error;
  dt_comm_h w = create(DT_ROLE_WORKER, 0, 3, 1);
  ASSERT_TRUE(w) << last_error;
  uint32_t sid = 0, did = 0;
  ASSERT_OK(declare(w, sd, &sid));
  ASSERT_OK(declare(w, dd, &did));
  ASSERT_OK(load(w, sid, dir));
  ASSERT_OK(load(w, did, dir));
  std::vector<float> sparse_after(keys.size() * dim, -9.0f), dense_after(dense_dim, -9.0f);
  ASSERT_OK(pull_sparse(w, sid, keys, sparse_after));
  ASSERT_OK(pull_dense(w, did, dense_after));
  EXPECT_EQ(sparse_after, sparse_before);
  for (size_t i = 0; i < dense_dim; ++i) EXPECT_FLOAT_EQ(dense_after[i], dense_before[i]) << i;

  Result r = load(w, sid, dir + "/nothing-here");
  EXPECT_NE(r.status, DT_OK);
  EXPECT_NE(r.error.find("nothing-here"), std::string::npos) << r.error;
  std::filesystem::remove_all(dir);
}

// Sync mode across 2 servers: every worker's push is one step on every
// server (a server that gets none of a push's keys still counts it), and a
// pull after the push sees the step applied: the average of both workers'
// gradients (sparse: summed over the workers that pushed the key, divided by
// the number of workers).
TEST_F(PsGrpc, SyncStepsAcrossTwoServers) {
  ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 2, 2) && create(DT_ROLE_SERVER, 1, 2, 2)) << last_error;
  dt_comm_h w[2] = {create(DT_ROLE_WORKER, 0, 2, 2), create(DT_ROLE_WORKER, 1, 2, 2)};
  ASSERT_TRUE(w[0] && w[1]) << last_error;
  const uint64_t dim = 2, dense_dim = 9;
  auto sd = desc("emb", DT_PS_TABLE_SPARSE, dim, DT_PS_MODE_SYNC);
  auto dd = desc("dense_w", DT_PS_TABLE_DENSE, dense_dim, DT_PS_MODE_SYNC);
  uint32_t sid[2], did[2];
  for (int r = 0; r < 2; ++r) {
    ASSERT_OK(declare(w[r], sd, &sid[r]));
    ASSERT_OK(declare(w[r], dd, &did[r]));
  }
  // Worker 0 pushes one key (so one server gets an empty push), worker 1 another.
  std::vector<uint64_t> keys[2] = {{11}, {12}};
  std::vector<float> values[2];
  for (int step = 1; step <= 2; ++step) {
    Result res[2][4];
    auto run = [&](int r) {
      std::vector<float> g(dense_dim, static_cast<float>(r + 1)), sg(dim, static_cast<float>(2 * (r + 1)));
      res[r][0] = push_dense(w[r], did[r], g, 10000);
      res[r][1] = push_sparse(w[r], sid[r], keys[r], sg);
      std::vector<float> v(dense_dim);
      res[r][2] = pull_dense(w[r], did[r], v, 10000);
      values[r] = v;
      std::vector<float> sv(2 * dim);
      res[r][3] = pull_sparse(w[r], sid[r], {11, 12}, sv, 10000);
      values[r].insert(values[r].end(), sv.begin(), sv.end());
    };
    std::thread t([&] { run(1); });
    run(0);
    t.join();
    for (auto& rr : res)
      for (auto& x : rr) ASSERT_OK(x);
    for (int r = 0; r < 2; ++r) {
      for (uint64_t i = 0; i < dense_dim; ++i) EXPECT_FLOAT_EQ(values[r][i], 0.5f - step * 1.5f) << i;
      EXPECT_FLOAT_EQ(values[r][dense_dim + 0], 0.5f - step * 1.0f);  // key 11: 2 / 2 workers
      EXPECT_FLOAT_EQ(values[r][dense_dim + 2], 0.5f - step * 2.0f);  // key 12: 4 / 2 workers
    }
  }
}

// A dense range over 4 MiB goes to its server as several calls at once
// (client.cc, kDensePushPartBytes): ASYNC applies each chunk as it arrives,
// SYNC stages the parts into one step; either way every value once.
TEST_F(PsGrpc, LargeDensePushesGoInPartsAndApplyEveryValueOnce) {
  ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 2, 2) && create(DT_ROLE_SERVER, 1, 2, 2)) << last_error;
  dt_comm_h w[2] = {create(DT_ROLE_WORKER, 0, 2, 2), create(DT_ROLE_WORKER, 1, 2, 2)};
  ASSERT_TRUE(w[0] && w[1]) << last_error;
  const uint64_t dim = (uint64_t{5} << 20) / 2 + 7;  // 10 MiB: 5 MiB and 2 parts per server
  auto g_of = [](int r, uint64_t i) { return r == 0 ? 0.25f * static_cast<float>(i % 13) : 1.0f; };
  for (int mode : {DT_PS_MODE_ASYNC, DT_PS_MODE_SYNC}) {
    auto dd = desc(mode == DT_PS_MODE_SYNC ? "big_sync" : "big_async", DT_PS_TABLE_DENSE, dim, mode);
    uint32_t id[2];
    for (int r = 0; r < 2; ++r) ASSERT_OK(declare(w[r], dd, &id[r]));
    Result res[2];
    auto push = [&](int r) {
      std::vector<float> g(dim);
      for (uint64_t i = 0; i < dim; ++i) g[i] = g_of(r, i);
      res[r] = push_dense(w[r], id[r], g, 20000);
    };
    std::thread t([&] { push(1); });
    push(0);
    t.join();
    ASSERT_OK(res[0]);
    ASSERT_OK(res[1]);
    const float scale = mode == DT_PS_MODE_SYNC ? 0.5f : 1.0f;  // SYNC: the average
    for (int r = 0; r < 2; ++r) {
      std::vector<float> v(dim, -9.0f);
      ASSERT_OK(pull_dense(w[r], id[r], v, 20000));
      uint64_t wrong = 0, first = dim;
      for (uint64_t i = 0; i < dim; ++i)
        if (v[i] != 0.5f - scale * (g_of(0, i) + g_of(1, i)) && wrong++ == 0) first = i;
      EXPECT_EQ(wrong, 0u) << "mode " << mode << ", worker " << r << ": first wrong value " << first << " = "
                           << (first < dim ? v[first] : 0.0f);
    }
  }
}

TEST(PsGrpcPublicApi, ServeReturnsWhenEveryWorkerFinished) {
  using namespace dtrain;
  auto backend = PluginRegistry({DTRAIN_BUILT_PLUGIN_DIR}).load("ps_grpc");
  auto store = std::make_shared<MemoryStore>();
  auto server = ps::start_server(backend, ps_options(store, Role::Server, 0, 1, 2));
  std::thread serving([&] { server->serve(); });
  ps::TableConfig emb;
  emb.name = "emb";
  emb.kind = ps::TableKind::Sparse;
  emb.dim = 4;
  emb.learning_rate = 0.5;
  ps::TableConfig lin = emb;
  lin.name = "linear";
  lin.kind = ps::TableKind::Dense;
  lin.dim = 10;
  auto run = [&](int r) {
    auto w = ps::connect_worker(backend, ps_options(store, Role::Worker, r, 1, 2), ps::ModeOptions{ps::Mode::Async});
    auto e = w->sparse_table(emb);
    auto d = w->dense_table(lin);
    std::vector<uint64_t> keys = {5, 6, 5};
    std::vector<float> g(keys.size() * 4, 1.0f), dg(10, 2.0f);
    e.push(keys.data(), keys.size(), Buffer::of(g.data(), g.size()))->wait();
    d.push(Buffer::of(dg.data(), dg.size()))->wait();
    w->barrier()->wait();
    std::vector<float> v(keys.size() * 4), dv(10);
    e.pull(keys.data(), keys.size(), Buffer::of(v.data(), v.size()))->wait();
    d.pull(Buffer::of(dv.data(), dv.size()))->wait();
    for (size_t i = 0; i < v.size(); ++i) EXPECT_FLOAT_EQ(v[i], i / 4 == 1 ? -1.0f : -2.0f) << i;  // 2 workers x lr 0.5
    for (float x : dv) EXPECT_FLOAT_EQ(x, -2.0f);
    w->finish();
  };
  std::thread t1([&] { run(1); });
  run(0);
  t1.join();
  serving.join();  // returns because both finished
}

}  // namespace
