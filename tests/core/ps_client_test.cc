// The parameter-server client (dtrain/ps.h) end to end on the real ps_grpc
// plugin: servers and workers as threads of this process, rendezvous through
// a MemoryStore, traffic over gRPC on loopback. Expected values are computed
// here from the ABI's formulas. Registered only when ps_grpc is built.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/ps.h"
#include "dtrain/role_maker.h"
#include "dtrain/store.h"

using namespace dtrain;
using namespace dtrain::ps;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

constexpr auto kTimeout = std::chrono::seconds(20);

std::shared_ptr<Backend> ps_backend() { return PluginRegistry({DTRAIN_BUILT_PLUGIN_DIR}).load("ps_grpc"); }

CommOptions options(const std::shared_ptr<Store>& store, Role role, int rank, int servers, int workers) {
  CommOptions o;
  o.role = role;
  o.rank = rank;
  o.world_size = workers;
  o.local_rank = rank;
  o.local_world_size = workers;  // one host: the servers bind loopback
  o.num_servers = servers;
  o.num_workers = workers;
  o.store = store;
  o.timeout = kTimeout;
  o.job_token = "ps-client-test-token";
  o.name = "ps";
  return o;
}

struct JobSpec {
  int servers = 1;
  int workers = 2;
  ModeOptions mode;
  CheckpointOptions checkpoints;
  std::shared_ptr<MemoryStore> store = std::make_shared<MemoryStore>();
};

// Runs the servers (serve() until every worker finished) and the workers
// (fn, then finish()) as threads; every error is a test failure naming its role.
void run_job(const JobSpec& spec, const std::function<void(int, PsWorker&)>& fn) {
  auto backend = ps_backend();
  std::vector<std::string> errors(spec.servers + spec.workers);
  std::vector<std::thread> threads;
  for (int s = 0; s < spec.servers; ++s)
    threads.emplace_back([&, s] {
      try {
        start_server(backend, options(spec.store, Role::Server, s, spec.servers, spec.workers))->serve();
      } catch (const std::exception& e) {
        errors[s] = e.what();
      }
    });
  for (int w = 0; w < spec.workers; ++w)
    threads.emplace_back([&, w] {
      try {
        auto worker = connect_worker(backend, options(spec.store, Role::Worker, w, spec.servers, spec.workers),
                                     spec.mode, spec.checkpoints);
        fn(w, *worker);
        worker->finish();
      } catch (const std::exception& e) {
        errors[spec.servers + w] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int s = 0; s < spec.servers; ++s) EXPECT_EQ(errors[s], "") << "server " << s;
  for (int w = 0; w < spec.workers; ++w) EXPECT_EQ(errors[spec.servers + w], "") << "worker " << w;
}

TableConfig dense(const std::string& name, uint64_t dim, double lr, double init) {
  TableConfig t;
  t.name = name;
  t.kind = TableKind::Dense;
  t.dim = dim;
  t.learning_rate = lr;
  t.initializer = Initializer::Constant;
  t.init_a = init;
  return t;
}

TableConfig sparse(const std::string& name, uint64_t dim, double lr) {
  TableConfig t = dense(name, dim, lr, 0.0);
  t.kind = TableKind::Sparse;
  return t;
}

Buffer f32(std::vector<float>& v) { return Buffer(v.data(), v.size(), DType::F32); }

std::string temp_dir(const std::string& tag) {
  auto d = fs::temp_directory_path() / ("dtrain-ps-client-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

}  // namespace

// Sync mode, 1 server x 2 workers: the step is the average of both pushes.
TEST(PsClient, SyncDenseAndSparsePullPush) {
  JobSpec spec;
  run_job(spec, [](int w, PsWorker& worker) {
    EXPECT_EQ(worker.worker_index(), w);
    EXPECT_EQ(worker.num_workers(), 2);
    EXPECT_EQ(worker.num_servers(), 1);
    auto d = worker.dense_table(dense("w", 10, 0.1, 1.0));
    auto e = worker.sparse_table(sparse("emb", 4, 0.5));
    EXPECT_EQ(d.dim(), 10u);
    EXPECT_EQ(e.name(), "emb");
    std::vector<float> v(10);
    d.pull(f32(v))->wait();
    EXPECT_EQ(v, std::vector<float>(10, 1.0f));

    std::vector<float> g(10, w == 0 ? 1.0f : 3.0f);
    d.push(f32(g))->wait();
    d.pull(f32(v))->wait();  // waits for step 1: w = 1 - 0.1 * (1 + 3) / 2
    for (float x : v) EXPECT_NEAR(x, 0.8f, 1e-6);

    std::vector<uint64_t> keys = w == 0 ? std::vector<uint64_t>{1, 2} : std::vector<uint64_t>{1, 1000};
    std::vector<float> grads =
        w == 0 ? std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2} : std::vector<float>{3, 3, 3, 3, 4, 4, 4, 4};
    e.push(keys.data(), keys.size(), f32(grads))->wait();
    std::vector<uint64_t> all = {1, 2, 1000, 1};
    std::vector<float> rows(all.size() * 4);
    e.pull(all.data(), all.size(), f32(rows))->wait();
    // per key: the workers' sum / num_workers, then w -= 0.5 * g
    std::vector<float> want = {-1, -1, -1, -1, -0.5f, -0.5f, -0.5f, -0.5f, -1, -1, -1, -1, -1, -1, -1, -1};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(rows[i], want[i], 1e-6) << "value " << i;
    worker.barrier()->wait();
  });
}

// Bad calls: the core refuses them before the plugin; a request a server
// refuses fails that op only; the client stays usable.
TEST(PsClient, RefusedCallsFailOnlyThatOp) {
  JobSpec spec;
  spec.workers = 1;
  spec.mode.mode = Mode::Async;
  run_job(spec, [](int, PsWorker& worker) {
    auto d = worker.dense_table(dense("w", 4, 0.1, 0.0));
    auto e = worker.sparse_table(sparse("emb", 2, 0.1));
    std::vector<float> three(3);
    try {
      d.push(f32(three));
      ADD_FAILURE() << "a push of 3 values to a dim-4 table was accepted";
    } catch (const InvalidUsage& x) {
      EXPECT_THAT(x.what(), HasSubstr("push on table 'w': grads holds 3 values, expected 4"));
    }
    std::vector<double> f64(4);
    EXPECT_THROW(d.pull(Buffer(f64.data(), 4, DType::F64)), InvalidUsage);
    std::vector<float> four(4);
    EXPECT_THROW(d.pull(Buffer(four.data(), 4, DType::F32, Device::cuda(0))), InvalidUsage);
    uint64_t keys[2] = {5, 6};
    EXPECT_THROW(e.pull(keys, 2, f32(three)), InvalidUsage);
    EXPECT_THROW(e.pull(nullptr, 2, f32(four)), InvalidUsage);
    EXPECT_THROW(worker.sparse_table(dense("x", 4, 0.1, 0.0)), InvalidUsage);

    // The server refuses a second declaration of "w" with another dim.
    try {
      worker.dense_table(dense("w", 5, 0.1, 0.0));
      ADD_FAILURE() << "a table redeclared with another dim was accepted";
    } catch (const InvalidUsage& x) {
      EXPECT_THAT(x.what(), HasSubstr("'w'"));
    }
    EXPECT_FALSE(worker.communicator()->is_poisoned());
    std::vector<float> g = {1, 2, 3, 4};
    d.push(f32(g))->wait();
    d.pull(f32(four))->wait();
    EXPECT_NEAR(four[3], -0.4f, 1e-6);
    std::vector<float> rows(4);
    e.pull(keys, 2, f32(rows))->wait();
    EXPECT_EQ(rows, std::vector<float>(4, 0.0f));
  });
}

// GEO, k = 2: the ordered schedule (worker 0 syncs before worker 1) makes the
// merged values exact (Paddle's GeoCommunicator formulas, lr 1).
TEST(PsClient, GeoSparseAndDense) {
  JobSpec spec;
  spec.mode.mode = Mode::Geo;
  spec.mode.geo_k_steps = 2;
  auto store = spec.store;
  run_job(spec, [&](int w, PsWorker& worker) {
    auto e = worker.sparse_table(sparse("emb", 2, 1.0));
    auto d = worker.dense_table(dense("w", 3, 1.0, 0.5));
    GeoSparseTable ge(e, worker.num_workers(), worker.mode().geo_k_steps);
    GeoDenseTable gd(d, worker.num_workers(), worker.mode().geo_k_steps);
    uint64_t key = 7;
    float row[2];
    ge.lookup(&key, 1, row);
    EXPECT_EQ(row[0], 0.0f);
    EXPECT_EQ(gd.values()[0], 0.5f);
    worker.barrier()->wait();  // both hold the initial copies
    if (w == 1) store->wait({"test/geo0"}, kTimeout);
    float g[2] = {w == 0 ? 1.0f : 10.0f, w == 0 ? 2.0f : 20.0f};
    for (int step = 0; step < 2; ++step) {
      ge.apply(&key, 1, g);
      for (int j = 0; j < 3; ++j) gd.values()[j] -= w == 0 ? 1.0f : 3.0f;
      ge.step();
      gd.step();
    }
    ge.lookup(&key, 1, row);
    if (w == 0) {
      EXPECT_FLOAT_EQ(row[0], -2.0f);  // -2 g0, the server then held -g0
      EXPECT_FLOAT_EQ(row[1], -4.0f);
      EXPECT_FLOAT_EQ(gd.values()[2], -1.5f);
      store->set("test/geo0", std::string("synced"));
    } else {
      EXPECT_FLOAT_EQ(row[0], -21.0f);  // -2 g1 - g0
      EXPECT_FLOAT_EQ(row[1], -42.0f);
      EXPECT_FLOAT_EQ(gd.values()[2], -6.5f);
    }
    worker.barrier()->wait();
    float server[2];
    e.pull(&key, 1, Buffer(server, 2, DType::F32))->wait();
    EXPECT_FLOAT_EQ(server[0], -11.0f);  // -(g0 + g1): the sum of both deltas
    EXPECT_FLOAT_EQ(server[1], -22.0f);
    std::vector<float> dv(3);
    d.pull(f32(dv))->wait();
    EXPECT_FLOAT_EQ(dv[1], -3.5f);
  });
}

TEST(PsClient, GeoNeedsGeoModeAndSgd) {
  JobSpec spec;
  spec.workers = 1;
  run_job(spec, [](int, PsWorker& worker) {
    auto e = worker.sparse_table(sparse("emb", 2, 1.0));
    try {
      GeoSparseTable g(e, 1, 2);
      ADD_FAILURE() << "a GEO table over a sync-mode table";
    } catch (const InvalidUsage& x) {
      EXPECT_THAT(x.what(), HasSubstr("sync mode"));
    }
  });
  spec.mode.mode = Mode::Geo;
  spec.mode.geo_k_steps = 3;
  run_job(spec, [](int, PsWorker& worker) {
    TableConfig adam = sparse("emb", 2, 1.0);
    adam.optimizer = Optimizer::Adam;
    try {
      worker.sparse_table(adam);
      ADD_FAILURE() << "GEO accepted adam";
    } catch (const InvalidUsage& x) {
      EXPECT_THAT(x.what(), HasSubstr("accepts only optimizer = \"sgd\""));
    }
  });
}

// save_checkpoint: step-<N> folders, an atomic LATEST, the two newest kept;
// a restarted job (restart_count 1) loads LATEST when declaring its tables.
TEST(PsClient, CheckpointSaveAndRestore) {
  std::string dir = temp_dir("ckpt");
  JobSpec spec;
  spec.mode.mode = Mode::Async;
  spec.checkpoints.dir = dir;
  std::vector<float> saved_dense(6);
  std::vector<float> saved_rows(2 * 3);
  uint64_t keys[2] = {11, 42};
  run_job(spec, [&](int w, PsWorker& worker) {
    EXPECT_EQ(worker.restored_step(), -1);
    auto d = worker.dense_table(dense("w", 6, 0.5, 0.0));
    auto e = worker.sparse_table(sparse("emb", 3, 0.5));
    for (int64_t step = 5; step <= 7; ++step) {
      std::vector<float> g(6, static_cast<float>(w + step));
      d.push(f32(g))->wait();
      std::vector<float> sg(6, 1.0f);
      e.push(keys, 2, f32(sg))->wait();
      worker.save_checkpoint(step);
    }
    if (w == 0) {
      d.pull(f32(saved_dense))->wait();
      e.pull(keys, 2, f32(saved_rows))->wait();
    }
  });
  std::ifstream latest(dir + "/LATEST");
  std::string line;
  std::getline(latest, line);
  EXPECT_EQ(line, "step-7");
  EXPECT_FALSE(fs::exists(dir + "/step-5")) << "only the two newest are kept";
  EXPECT_TRUE(fs::exists(dir + "/step-6/w/MANIFEST"));
  EXPECT_TRUE(fs::exists(dir + "/step-7/emb/MANIFEST"));
  // async: 2 workers x 3 pushes of (w + step) and lr 0.5 from 0
  EXPECT_NEAR(saved_dense[0], -0.5f * (5 + 6 + 6 + 7 + 7 + 8), 1e-5);

  JobSpec again;
  again.mode.mode = Mode::Async;
  again.checkpoints.dir = dir;
  again.checkpoints.restart_count = 1;
  run_job(again, [&](int, PsWorker& worker) {
    EXPECT_EQ(worker.restored_step(), 7);
    auto d = worker.dense_table(dense("w", 6, 0.5, 0.0));
    auto e = worker.sparse_table(sparse("emb", 3, 0.5));
    std::vector<float> v(6), rows(6);
    d.pull(f32(v))->wait();
    e.pull(keys, 2, f32(rows))->wait();
    EXPECT_EQ(v, saved_dense);
    EXPECT_EQ(rows, saved_rows);
  });
  fs::remove_all(dir);
}

// A checkpoint worker 0 cannot write fails every worker with its reason.
TEST(PsClient, AFailedCheckpointFailsEveryWorkerWithTheReason) {
  std::string dir = temp_dir("badckpt");
  std::ofstream(dir + "/file") << "not a folder\n";
  JobSpec spec;
  spec.mode.mode = Mode::Async;
  spec.checkpoints.dir = dir + "/file/ckpt";
  run_job(spec, [&](int w, PsWorker& worker) {
    worker.dense_table(dense("w", 2, 0.5, 0.0));
    try {
      worker.save_checkpoint(1);
      ADD_FAILURE() << "a checkpoint under a regular file was saved";
    } catch (const Error& e) {
      if (w == 0)
        EXPECT_THAT(e.what(), HasSubstr("cannot create the checkpoint folder"));
      else
        EXPECT_THAT(e.what(), AllOf(HasSubstr("worker 0 could not save checkpoint step-1"),
                                    HasSubstr("cannot create the checkpoint folder")));
    }
    EXPECT_FALSE(worker.communicator()->is_poisoned());
  });
  fs::remove_all(dir);
}

// The launcher's stop key ends serve() although no worker finished.
TEST(PsClient, ServeReturnsOnTheLaunchersStopKey) {
  auto store = std::make_shared<MemoryStore>();
  auto server = start_server(ps_backend(), options(store, Role::Server, 0, 1, 1));
  EXPECT_EQ(server->server_index(), 0);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    store->set("ps/stop", std::string("every worker has finished"));
  });
  auto t0 = std::chrono::steady_clock::now();
  server->serve();
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));

  auto other = start_server(ps_backend(), options(std::make_shared<MemoryStore>(), Role::Server, 0, 1, 1));
  other->stop("before serving");
  other->serve();  // returns at once
}

// Sync mode: a worker that never pushes makes the other's pull time out,
// naming it; a timeout poisons the client.
TEST(PsClient, SyncPullTimesOutNamingTheMissingWorker) {
  JobSpec spec;
  auto store = spec.store;
  run_job(spec, [&](int w, PsWorker& worker) {
    auto d = worker.dense_table(dense("w", 4, 0.1, 0.0));
    if (w == 1) {
      store->wait({"test/timed_out"}, kTimeout);
      return;
    }
    std::vector<float> g(4, 1.0f);
    d.push(f32(g))->wait();
    try {
      d.pull(f32(g), CallOptions{std::chrono::milliseconds(1500)})->wait();
      ADD_FAILURE() << "the pull of step 1 completed without worker 1's push";
    } catch (const TimeoutError& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr("worker 0 of 2: ps_pull_dense (table 'w'"),
                                  HasSubstr("waiting for worker(s) 1 that have not pushed it")));
    }
    EXPECT_TRUE(worker.communicator()->is_poisoned());
    store->set("test/timed_out", std::string("yes"));
    // A poisoned client cannot say it finished: the launcher stops the server.
    store->set("ps/stop", std::string("worker 0 failed"));
  });
}

TEST(PsClient, ACollectiveBackendIsNotAParameterServer) {
  auto gloo = PluginRegistry({DTRAIN_BUILT_PLUGIN_DIR}).load("gloo");
  CommOptions o = options(std::make_shared<MemoryStore>(), Role::Worker, 0, 1, 1);
  try {
    connect_worker(gloo, o, ModeOptions{});
    FAIL();
  } catch (const NotSupported& e) {
    EXPECT_THAT(e.what(), HasSubstr("backend 'gloo' does not support parameter-server tables (ps-server)"));
  }
}

namespace {
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}
}  // namespace

// Paddle's PS variables set by hand, no launcher: server 0 serves the store on
// its listed endpoint, the workers find it there, join the PS and a Gloo
// communicator over the workers, and the mode comes from [strategy].
TEST(PsClient, JoinWithPaddleVariablesByHand) {
  std::string port = std::to_string(free_port());
  Config config = Config::from_string(std::string("[plugins]\npath = [\"") + DTRAIN_BUILT_PLUGIN_DIR +
                                          "\"]\n[strategy]\na_sync = true\n[ps]\nbackend = \"ps_grpc\"\n"
                                          "collective = \"gloo\"\ntimeout_s = 20\n",
                                      "job.toml");
  std::map<std::string, std::string> common = {
      {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:" + port}, {"PADDLE_TRAINERS_NUM", "2"}, {"POD_IP", "127.0.0.1"}};
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    try {
      auto env = common;
      env["TRAINING_ROLE"] = "PSERVER";
      env["PADDLE_PORT"] = port;
      PsJob job = join_ps(config, EnvRoleMaker(env).resolve());
      ASSERT_TRUE(job.server);
      ASSERT_TRUE(job.store_server) << "server 0 serves the store";
      EXPECT_FALSE(job.worker);
      job.server->serve();
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
  });
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      try {
        auto env = common;
        env["TRAINING_ROLE"] = "TRAINER";
        env["PADDLE_TRAINER_ID"] = std::to_string(w);
        env["PADDLE_PORT"] = std::to_string(7300 + w);
        PsJob job = join_ps(config, EnvRoleMaker(env).resolve());
        ASSERT_TRUE(job.worker);
        ASSERT_TRUE(job.collective);
        EXPECT_FALSE(job.store_server);
        EXPECT_EQ(job.worker->mode().mode, Mode::Async);
        EXPECT_EQ(job.worker->num_servers(), 1);
        auto d = job.worker->dense_table(dense("w", 2, 1.0, 0.0));
        std::vector<float> g = {1.0f, 2.0f};
        d.push(f32(g))->wait();
        job.worker->barrier()->wait();
        d.pull(f32(g))->wait();
        EXPECT_EQ(g, (std::vector<float>{-2.0f, -4.0f}));  // async: both pushes applied, lr 1
        float one = 1.0f;
        job.collective->allreduce(Buffer(&one, 1, DType::F32))->wait();
        EXPECT_EQ(one, 2.0f);
        job.worker->finish();
      } catch (const std::exception& e) {
        errors[1 + w] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < errors.size(); ++i) EXPECT_EQ(errors[i], "") << (i == 0 ? "server" : "worker ") << i;
}
