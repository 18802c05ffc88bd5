// The ps_grpc plugin's failures, through its C table and the core's public
// API: a wrong token or job shape refused, bad requests that leave the
// server serving, a dead server named within the timeout, sync waits and
// barriers that time out naming the missing worker (fixture: ps_grpc_util.h).

#include "ps_grpc_util.h"

namespace {

using namespace ps_grpc_test;  // NOLINT(build/namespaces)

TEST_F(PsGrpc, WrongOrMissingTokenIsRefusedAndLogged) {
  LogCapture log;
  ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 1, 1, "job-secret")) << last_error;
  EXPECT_EQ(create(DT_ROLE_WORKER, 0, 1, 1, "not-the-secret"), nullptr);
  EXPECT_NE(last_error.find("parameter server 0"), std::string::npos) << last_error;
  EXPECT_NE(last_error.find("refused this client"), std::string::npos) << last_error;
  EXPECT_NE(last_error.find("wrong job token"), std::string::npos) << last_error;
  EXPECT_EQ(create(DT_ROLE_WORKER, 0, 1, 1, ""), nullptr);
  EXPECT_NE(last_error.find("missing job token"), std::string::npos) << last_error;
  std::string text = log.text();
  EXPECT_NE(text.find("refused a client from"), std::string::npos) << text;
  EXPECT_NE(text.find("wrong job token"), std::string::npos) << text;
  EXPECT_NE(text.find("missing job token"), std::string::npos) << text;
  // The right token still gets in.
  dt_comm_h w = create(DT_ROLE_WORKER, 0, 1, 1, "job-secret");
  ASSERT_TRUE(w) << last_error;
}

TEST_F(PsGrpc, MismatchedJobShapeIsRefused) {
  ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 1, 2)) << last_error;
  EXPECT_EQ(create(DT_ROLE_WORKER, 0, 1, 3), nullptr);
  EXPECT_NE(last_error.find("num_workers is 2"), std::string::npos) << last_error;
}

TEST_F(PsGrpc, BadRequestsFailClearlyAndTheServerGoesOn) {
  const std::string cfg = "max_request_bytes = 65536\n";
  ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 1, 2, "job-secret", cfg)) << last_error;
  dt_comm_h w0 = create(DT_ROLE_WORKER, 0, 1, 2, "job-secret", cfg);
  dt_comm_h w1 = create(DT_ROLE_WORKER, 1, 1, 2, "job-secret", cfg);
  ASSERT_TRUE(w0 && w1) << last_error;
  uint32_t id = 0, other = 0;
  ASSERT_OK(declare(w0, desc("emb", DT_PS_TABLE_SPARSE, 8), &id));

  // The same table declared with another dimension: the server names it.
  Result r = declare(w1, desc("emb", DT_PS_TABLE_SPARSE, 16), &other);
  EXPECT_EQ(r.status, DT_ERR_INVALID_USAGE);
  EXPECT_NE(r.error.find("'emb'"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("dim"), std::string::npos) << r.error;

  // Gradients that do not match the dimension.
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> short_grads(3 * 8 - 1, 1.0f);
  r = push_sparse(w0, id, keys, short_grads);
  EXPECT_EQ(r.status, DT_ERR_INVALID_USAGE);
  EXPECT_NE(r.error.find("'emb'"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("23"), std::string::npos) << r.error;

  // Over max_request_bytes: 4096 keys x (8 + 32) bytes.
  std::vector<uint64_t> many(4096);
  for (size_t i = 0; i < many.size(); ++i) many[i] = i;
  std::vector<float> big(many.size() * 8);
  r = pull_sparse(w0, id, many, big);
  EXPECT_EQ(r.status, DT_ERR_INVALID_USAGE);
  EXPECT_NE(r.error.find("'emb'"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("163840 bytes"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("max_request_bytes = 65536"), std::string::npos) << r.error;
  r = push_sparse(w0, id, many, big);
  EXPECT_EQ(r.status, DT_ERR_INVALID_USAGE);
  EXPECT_NE(r.error.find("max_request_bytes"), std::string::npos) << r.error;

  // An unknown table id, a dtype the tables do not hold.
  std::vector<float> v(3 * 8);
  r = pull_sparse(w0, 7, keys, v);
  EXPECT_EQ(r.status, DT_ERR_INVALID_USAGE);
  EXPECT_NE(r.error.find("table id 7"), std::string::npos) << r.error;

  // The server still serves both workers.
  std::vector<float> g(3 * 8, 0.25f);
  EXPECT_OK(push_sparse(w0, id, keys, g));
  ASSERT_OK(pull_sparse(w0, id, keys, v));
  for (float x : v) EXPECT_FLOAT_EQ(x, 0.25f);
  ASSERT_OK(declare(w1, desc("emb", DT_PS_TABLE_SPARSE, 8), &other));
  ASSERT_OK(pull_sparse(w1, other, keys, v));
  for (float x : v) EXPECT_FLOAT_EQ(x, 0.25f);
}

// A server that goes away: the next call fails within its timeout, naming
// the server's index and endpoint; the other server still answers.
TEST_F(PsGrpc, DeadServerIsNamedWithinTheTimeout) {
  dt_comm_h s0 = create(DT_ROLE_SERVER, 0, 2, 1);
  dt_comm_h s1 = create(DT_ROLE_SERVER, 1, 2, 1);
  ASSERT_TRUE(s0 && s1) << last_error;
  dt_comm_h w = create(DT_ROLE_WORKER, 0, 2, 1);
  ASSERT_TRUE(w) << last_error;
  std::string endpoint = store.get_string("ps/server/1");
  uint32_t id = 0;
  ASSERT_OK(declare(w, desc("dense_w", DT_PS_TABLE_DENSE, 64), &id));
  std::vector<float> v(64);
  ASSERT_OK(pull_dense(w, id, v));

  destroy(s1);
  Result r = pull_dense(w, id, v, 3000);
  EXPECT_EQ(r.status, DT_ERR_REMOTE) << r.error;
  EXPECT_NE(r.error.find("parameter server 1 (" + endpoint + ")"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("unreachable"), std::string::npos) << r.error;
  EXPECT_LT(r.seconds, 4.0);
}

// Sync mode with a worker that never pushes: a pull waits for the step; the
// server answers before the client's deadline, naming the missing worker;
// and an abort releases a pending pull at once.
TEST_F(PsGrpc, SyncWaitTimesOutNamingTheWorkerAndAbortUnblocks) {
  dt_comm_h w[2];
  uint32_t id[2];
  ASSERT_NO_FATAL_FAILURE(open_sync_step("dense_sync", "", w, id));
  std::vector<float> g(16, 1.0f), v(16);

  Result r = pull_dense(w[0], id[0], v, 1500);
  EXPECT_EQ(r.status, DT_ERR_TIMEOUT) << r.error;
  EXPECT_NE(r.error.find("parameter server 0 ("), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("'dense_sync'"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("waiting for worker(s) 1 "), std::string::npos) << r.error;
  EXPECT_LT(r.seconds, 1.6);  // the server's answer, before the client's own deadline

  auto o = opts(5000);
  auto b = buf(v);
  dt_work_h h = nullptr;
  ASSERT_EQ(be->ps_pull_dense(w[0], id[0], &b, &o, &h), DT_OK);
  EXPECT_EQ(be->work_wait(h, 300), DT_IN_PROGRESS);
  auto t0 = Clock::now();
  std::thread t([&] { be->comm_abort(w[0], "the watchdog fired"); });
  dt_status_t st = be->work_wait(h, 5000);
  double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  t.join();
  EXPECT_EQ(st, DT_ERR_ABORTED);
  EXPECT_NE(std::string(be->work_error(h)).find("the watchdog fired"), std::string::npos) << be->work_error(h);
  EXPECT_LT(waited, 1.0);
  be->work_release(h);
  // Later ops on the aborted communicator are refused at once.
  Result later = pull_dense(w[0], id[0], v);
  EXPECT_EQ(later.status, DT_ERR_ABORTED);
  // The missing worker's push completes the step (and the server's wait).
  EXPECT_OK(push_dense(w[1], id[1], g));
}

// wait_spin_us: a wait polls first, but never past its own timeout; out of
// range is refused naming the key.
TEST_F(PsGrpc, WaitSpinStopsAtTheWaitsTimeout) {
  EXPECT_FALSE(create(DT_ROLE_WORKER, 0, 1, 1, "job-secret", "wait_spin_us = -1\n"));
  EXPECT_NE(last_error.find("wait_spin_us"), std::string::npos) << last_error;
  dt_comm_h w[2];
  uint32_t id[2];
  ASSERT_NO_FATAL_FAILURE(open_sync_step("dense_spin", "wait_spin_us = 1000000\n", w, id));
  std::vector<float> g(16, 1.0f), v(16);
  // A small pull (spins) that waits for worker 1's push.
  auto o = opts(20000);
  auto b = buf(v);
  dt_work_h h = nullptr;
  ASSERT_EQ(be->ps_pull_dense(w[0], id[0], &b, &o, &h), DT_OK);
  auto t0 = Clock::now();
  EXPECT_EQ(be->work_wait(h, 0), DT_IN_PROGRESS);
  EXPECT_EQ(be->work_wait(h, 10), DT_IN_PROGRESS);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.5);  // not the 1 s spin
  EXPECT_OK(push_dense(w[1], id[1], g));
  EXPECT_EQ(be->work_wait(h, 20000), DT_OK) << be->work_error(h);
  be->work_release(h);
}

TEST_F(PsGrpc, BarrierTimeoutNamesTheMissingWorker) {
  ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 1, 3)) << last_error;
  dt_comm_h w0 = create(DT_ROLE_WORKER, 0, 1, 3);
  dt_comm_h w1 = create(DT_ROLE_WORKER, 1, 1, 3);
  ASSERT_TRUE(w0 && w1 && create(DT_ROLE_WORKER, 2, 1, 3)) << last_error;
  Result r1;
  std::thread t([&] { r1 = barrier(w1, 1500); });
  Result r0 = barrier(w0, 1500);
  t.join();
  for (auto* r : {&r0, &r1}) {
    EXPECT_EQ(r->status, DT_ERR_TIMEOUT) << r->error;
    EXPECT_NE(r->error.find("worker 2 of 3"), std::string::npos) << r->error;
  }
}

// A save made on 2 servers loads onto 3 (a new job: new servers, new ports);
// the manifest lists every server's part files; a load from a directory
// without a save names it.

TEST(PsGrpcPublicApi, DeadServerIsARemoteErrorNamingIt) {
  using namespace dtrain;
  auto backend = PluginRegistry({DTRAIN_BUILT_PLUGIN_DIR}).load("ps_grpc");
  auto store = std::make_shared<MemoryStore>();
  auto s0 = ps::start_server(backend, ps_options(store, Role::Server, 0, 2, 1));
  auto s1 = ps::start_server(backend, ps_options(store, Role::Server, 1, 2, 1));
  auto w = ps::connect_worker(backend, ps_options(store, Role::Worker, 0, 2, 1), ps::ModeOptions{ps::Mode::Async});
  ps::TableConfig lin;
  lin.name = "linear";
  lin.kind = ps::TableKind::Dense;
  lin.dim = 8;
  auto d = w->dense_table(lin);
  std::vector<float> v(8);
  d.pull(Buffer::of(v.data(), v.size()))->wait();
  s1.reset();
  CallOptions o;
  o.timeout = std::chrono::seconds(3);
  auto t0 = std::chrono::steady_clock::now();
  try {
    d.pull(Buffer::of(v.data(), v.size()), o)->wait();
    ADD_FAILURE() << "a pull from a dead server succeeded";
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter server 1 ("), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
}

}  // namespace
