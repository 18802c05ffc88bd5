// The ps_grpc plugin through its C table (dt_backend_v1_t), loaded with the
// core's PluginRegistry: servers and workers are communicators in this
// process, rendezvous through a MemoryStore, traffic over real gRPC on
// loopback. Values are checked against sums computed here.

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "dtrain/abi/backend_v1.h"
#include "dtrain/error.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/ps.h"
#include "dtrain/store.h"
#include "plugin/backend_impl.h"

namespace {

using Clock = std::chrono::steady_clock;

// dt_store_v1_t over a dtrain::Store, as the core hands it to a plugin.
struct CStore {
  dtrain::Store* store;
  dt_store_v1_t table{};
  explicit CStore(dtrain::Store* s) : store(s) {
    table.ctx = this;
    table.set = [](void* c, const char* k, const void* v, uint64_t n) -> dt_status_t {
      auto* p = static_cast<const uint8_t*>(v);
      self(c)->store->set(k, dtrain::Bytes(p, p + n));
      return DT_OK;
    };
    table.get = [](void* c, const char* k, int64_t ms, void** v, uint64_t* n) -> dt_status_t {
      try {
        dtrain::Bytes b = self(c)->store->get(k, std::chrono::milliseconds(ms));
        *v = std::malloc(b.size() + 1);
        std::memcpy(*v, b.data(), b.size());
        *n = b.size();
        return DT_OK;
      } catch (const dtrain::TimeoutError&) {
        return DT_ERR_TIMEOUT;
      }
    };
    table.free_value = [](void*, void* v) { std::free(v); };
    table.add = [](void* c, const char* k, int64_t d, int64_t* r) -> dt_status_t {
      *r = self(c)->store->add(k, d);
      return DT_OK;
    };
    table.wait = [](void* c, const char* const* ks, uint32_t n, int64_t ms) -> dt_status_t {
      try {
        self(c)->store->wait(std::vector<std::string>(ks, ks + n), std::chrono::milliseconds(ms));
        return DT_OK;
      } catch (const dtrain::TimeoutError&) {
        return DT_ERR_TIMEOUT;
      }
    };
    table.remove = [](void* c, const char* k) -> dt_status_t {
      self(c)->store->remove(k);
      return DT_OK;
    };
  }
  static CStore* self(void* c) { return static_cast<CStore*>(c); }
};

const dt_backend_v1_t* backend() {
  static std::shared_ptr<dtrain::Backend> b = dtrain::PluginRegistry({DTRAIN_BUILT_PLUGIN_DIR}).load("ps_grpc");
  return b->impl().table;
}

// What the core's logger writes while a test runs.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    dtrain::detail::logger().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& s = dtrain::detail::logger().sinks();
    s.erase(std::remove(s.begin(), s.end(), sink_), s.end());
  }
  std::string text() {
    sink_->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

struct Result {
  dt_status_t status;
  std::string error;
  double seconds;
};

class PsGrpc : public ::testing::Test {
 protected:
  const dt_backend_v1_t* be = backend();
  dtrain::MemoryStore store;
  CStore cstore{&store};
  std::vector<dt_comm_h> comms;
  std::string last_error;

  void TearDown() override {
    for (auto it = comms.rbegin(); it != comms.rend(); ++it) {
      be->comm_abort(*it, "test over");
      be->comm_destroy(*it);
    }
  }

  // A server or worker communicator; nullptr with last_error on failure.
  dt_comm_h create(int role, int rank, int servers, int workers, const std::string& token = "job-secret",
                   const std::string& config = "", int64_t timeout_ms = 20000) {
    dt_comm_init_v1_t in{};
    in.struct_size = sizeof(in);
    in.rank = rank;
    in.world_size = workers;
    in.local_rank = rank;
    in.local_world_size = in.world_size;
    in.role = role;
    in.timeout_ms = timeout_ms;
    in.store = &cstore.table;
    in.config_toml = config.c_str();
    in.job_id = "test";
    in.job_token = token.c_str();
    in.num_servers = servers;
    in.num_workers = workers;
    dt_comm_h c = nullptr;
    if (be->comm_create(&in, &c) != DT_OK) {
      last_error = be->backend_last_error();
      return nullptr;
    }
    comms.push_back(c);
    return c;
  }
  void destroy(dt_comm_h c) {
    comms.erase(std::remove(comms.begin(), comms.end(), c), comms.end());
    be->comm_destroy(c);
  }

  // Waits for a work submitted by a slot call; a refused submission is a result too.
  Result finish(dt_comm_h c, dt_status_t submitted, dt_work_h w, int64_t wait_ms = 30000) {
    auto t0 = Clock::now();
    if (submitted != DT_OK) return {submitted, be->comm_last_error(c), 0.0};
    dt_status_t st = be->work_wait(w, wait_ms);
    Result r{st, st == DT_OK || st == DT_IN_PROGRESS ? "" : be->work_error(w),
             std::chrono::duration<double>(Clock::now() - t0).count()};
    if (st != DT_IN_PROGRESS) be->work_release(w);
    return r;
  }

  static dt_call_opts_v1_t opts(int64_t timeout_ms = 0) {
    dt_call_opts_v1_t o{};
    o.struct_size = sizeof(o);
    o.timeout_ms = timeout_ms;
    return o;
  }
  static dt_buffer_v1_t buf(std::vector<float>& v) {
    dt_buffer_v1_t b{};
    b.ptr = v.data();
    b.count = v.size();
    b.dtype = DT_DTYPE_F32;
    b.device_type = DT_DEVICE_CPU;
    return b;
  }
  static dt_ps_table_desc_v1_t desc(const char* name, int kind, uint64_t dim, int mode = DT_PS_MODE_ASYNC) {
    dt_ps_table_desc_v1_t d{};
    d.struct_size = sizeof(d);
    d.kind = kind;
    d.name = name;
    d.dim = dim;
    d.dtype = DT_DTYPE_F32;
    d.mode = mode;
    d.optimizer = DT_PS_OPT_SGD;
    d.initializer = DT_PS_INIT_CONSTANT;
    d.learning_rate = 1.0;
    d.init_a = 0.5;
    d.admit_probability = 1.0;
    d.decay_rate = 1.0;
    d.nonclk_coeff = 1.0;
    d.click_coeff = 1.0;
    return d;
  }

  Result declare(dt_comm_h w, const dt_ps_table_desc_v1_t& d, uint32_t* id) {
    auto o = opts();
    dt_work_h h = nullptr;
    dt_status_t st = be->ps_table(w, &d, id, &o, &h);
    return finish(w, st, h);
  }
  Result push_dense(dt_comm_h w, uint32_t id, std::vector<float>& g, int64_t timeout_ms = 0) {
    auto o = opts(timeout_ms);
    auto b = buf(g);
    dt_work_h h = nullptr;
    dt_status_t st = be->ps_push_dense(w, id, &b, &o, &h);
    return finish(w, st, h);
  }
  Result pull_dense(dt_comm_h w, uint32_t id, std::vector<float>& v, int64_t timeout_ms = 0) {
    auto o = opts(timeout_ms);
    auto b = buf(v);
    dt_work_h h = nullptr;
    dt_status_t st = be->ps_pull_dense(w, id, &b, &o, &h);
    return finish(w, st, h);
  }
  Result push_sparse(dt_comm_h w, uint32_t id, const std::vector<uint64_t>& keys, std::vector<float>& g) {
    auto o = opts();
    auto b = buf(g);
    dt_work_h h = nullptr;
    dt_status_t st = be->ps_push_sparse(w, id, keys.data(), keys.size(), &b, nullptr, &o, &h);
    return finish(w, st, h);
  }
  Result pull_sparse(dt_comm_h w, uint32_t id, const std::vector<uint64_t>& keys, std::vector<float>& v,
                     int64_t timeout_ms = 0) {
    auto o = opts(timeout_ms);
    auto b = buf(v);
    dt_work_h h = nullptr;
    dt_status_t st = be->ps_pull_sparse(w, id, keys.data(), keys.size(), &b, &o, &h);
    return finish(w, st, h);
  }
  Result save(dt_comm_h w, uint32_t id, const std::string& dir, int mode, int format) {
    auto o = opts();
    dt_work_h h = nullptr;
    dt_status_t st = be->ps_save(w, id, dir.c_str(), mode, format, &o, &h);
    return finish(w, st, h);
  }
  Result load(dt_comm_h w, uint32_t id, const std::string& dir) {
    auto o = opts();
    dt_work_h h = nullptr;
    dt_status_t st = be->ps_load(w, id, dir.c_str(), &o, &h);
    return finish(w, st, h);
  }
  Result barrier(dt_comm_h w, int64_t timeout_ms = 0) {
    auto o = opts(timeout_ms);
    dt_work_h h = nullptr;
    dt_status_t st = be->ps_barrier(w, &o, &h);
    return finish(w, st, h);
  }
  Result finish_worker(dt_comm_h w) {
    auto o = opts();
    dt_work_h h = nullptr;
    dt_status_t st = be->ps_finish(w, &o, &h);
    return finish(w, st, h);
  }
};

#define EXPECT_OK(r) EXPECT_EQ((r).status, DT_OK) << (r).error
#define ASSERT_OK(r) ASSERT_EQ((r).status, DT_OK) << (r).error

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
  ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 1, 2)) << last_error;
  dt_comm_h w0 = create(DT_ROLE_WORKER, 0, 1, 2);
  dt_comm_h w1 = create(DT_ROLE_WORKER, 1, 1, 2);
  ASSERT_TRUE(w0 && w1) << last_error;
  uint32_t id = 0, id1 = 0;
  auto d = desc("dense_sync", DT_PS_TABLE_DENSE, 16, DT_PS_MODE_SYNC);
  ASSERT_OK(declare(w0, d, &id));
  ASSERT_OK(declare(w1, d, &id1));
  std::vector<float> g(16, 1.0f), v(16);
  ASSERT_OK(push_dense(w0, id, g));

  Result r = pull_dense(w0, id, v, 1500);
  EXPECT_EQ(r.status, DT_ERR_TIMEOUT) << r.error;
  EXPECT_NE(r.error.find("parameter server 0 ("), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("'dense_sync'"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("waiting for worker(s) 1 "), std::string::npos) << r.error;
  EXPECT_LT(r.seconds, 1.6);  // the server's answer, before the client's own deadline

  auto o = opts(5000);
  auto b = buf(v);
  dt_work_h h = nullptr;
  ASSERT_EQ(be->ps_pull_dense(w0, id, &b, &o, &h), DT_OK);
  EXPECT_EQ(be->work_wait(h, 300), DT_IN_PROGRESS);
  auto t0 = Clock::now();
  std::thread t([&] { be->comm_abort(w0, "the watchdog fired"); });
  dt_status_t st = be->work_wait(h, 5000);
  double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  t.join();
  EXPECT_EQ(st, DT_ERR_ABORTED);
  EXPECT_NE(std::string(be->work_error(h)).find("the watchdog fired"), std::string::npos) << be->work_error(h);
  EXPECT_LT(waited, 1.0);
  be->work_release(h);
  // Later ops on the aborted communicator are refused at once.
  Result later = pull_dense(w0, id, v);
  EXPECT_EQ(later.status, DT_ERR_ABORTED);
  // The missing worker's push completes the step (and the server's wait).
  EXPECT_OK(push_dense(w1, id1, g));
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

// The same plugin through the core's public API (dtrain/ps.h): a server's
// serve() returns once both workers have finished; a dead server surfaces as
// RemoteError naming it.
dtrain::CommOptions ps_options(std::shared_ptr<dtrain::Store> store, dtrain::Role role, int rank, int servers,
                               int workers) {
  dtrain::CommOptions o;
  o.role = role;
  o.rank = rank;
  o.world_size = workers;  // a PS communicator's world is its workers (dt_comm_init_v1_t)
  o.local_rank = rank;
  o.local_world_size = o.world_size;
  o.store = std::move(store);
  o.timeout = std::chrono::seconds(20);
  o.name = "ps";
  o.job_id = "test";
  o.num_servers = servers;
  o.num_workers = workers;
  o.job_token = "job-secret";
  return o;
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
