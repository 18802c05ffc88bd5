#pragma once
// What the ps_grpc plugin's tests (ps_grpc_test.cc, ps_grpc_failure_test.cc)
// share: the store as the core hands it to a plugin, the plugin's C table,
// a log capture, and the PsGrpc fixture that makes servers and workers as
// communicators in this process and runs PS ops on them.

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

namespace ps_grpc_test {

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

inline const dt_backend_v1_t* backend() {
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

  // 1 server and 2 workers; a SYNC dense table of 16 values that worker 0 has
  // pushed ones to and worker 1 not yet, so worker 0's pulls wait for the
  // step until worker 1 pushes. Call it in ASSERT_NO_FATAL_FAILURE.
  void open_sync_step(const char* table, const std::string& w0_config, dt_comm_h w[2], uint32_t id[2]) {
    ASSERT_TRUE(create(DT_ROLE_SERVER, 0, 1, 2)) << last_error;
    w[0] = create(DT_ROLE_WORKER, 0, 1, 2, "job-secret", w0_config);
    w[1] = create(DT_ROLE_WORKER, 1, 1, 2);
    ASSERT_TRUE(w[0] && w[1]) << last_error;
    auto d = desc(table, DT_PS_TABLE_DENSE, 16, DT_PS_MODE_SYNC);
    for (int r = 0; r < 2; ++r) {
      Result dr = declare(w[r], d, &id[r]);
      ASSERT_EQ(dr.status, DT_OK) << dr.error;
    }
    std::vector<float> g(16, 1.0f);
    Result pr = push_dense(w[0], id[0], g);
    ASSERT_EQ(pr.status, DT_OK) << pr.error;
  }

  // One ABI call f(&opts, &handle) with its deadline, then waited for.
  template <typename F>
  Result call(dt_comm_h w, int64_t timeout_ms, F f) {
    auto o = opts(timeout_ms);
    dt_work_h h = nullptr;
    dt_status_t st = f(&o, &h);
    return finish(w, st, h);
  }
  Result declare(dt_comm_h w, const dt_ps_table_desc_v1_t& d, uint32_t* id) {
    return call(w, 0, [&](auto* o, dt_work_h* h) { return be->ps_table(w, &d, id, o, h); });
  }
  Result push_dense(dt_comm_h w, uint32_t id, std::vector<float>& g, int64_t timeout_ms = 0) {
    auto b = buf(g);
    return call(w, timeout_ms, [&](auto* o, dt_work_h* h) { return be->ps_push_dense(w, id, &b, o, h); });
  }
  Result pull_dense(dt_comm_h w, uint32_t id, std::vector<float>& v, int64_t timeout_ms = 0) {
    auto b = buf(v);
    return call(w, timeout_ms, [&](auto* o, dt_work_h* h) { return be->ps_pull_dense(w, id, &b, o, h); });
  }
  Result push_sparse(dt_comm_h w, uint32_t id, const std::vector<uint64_t>& keys, std::vector<float>& g) {
    auto b = buf(g);
    return call(w, 0, [&](auto* o, dt_work_h* h) {
      return be->ps_push_sparse(w, id, keys.data(), keys.size(), &b, nullptr, o, h);
    });
  }
  Result pull_sparse(dt_comm_h w, uint32_t id, const std::vector<uint64_t>& keys, std::vector<float>& v,
                     int64_t timeout_ms = 0) {
    auto b = buf(v);
    return call(w, timeout_ms,
                [&](auto* o, dt_work_h* h) { return be->ps_pull_sparse(w, id, keys.data(), keys.size(), &b, o, h); });
  }
  Result save(dt_comm_h w, uint32_t id, const std::string& dir, int mode, int format) {
    return call(w, 0, [&](auto* o, dt_work_h* h) { return be->ps_save(w, id, dir.c_str(), mode, format, o, h); });
  }
  Result load(dt_comm_h w, uint32_t id, const std::string& dir) {
    return call(w, 0, [&](auto* o, dt_work_h* h) { return be->ps_load(w, id, dir.c_str(), o, h); });
  }
  Result barrier(dt_comm_h w, int64_t timeout_ms = 0) {
    return call(w, timeout_ms, [&](auto* o, dt_work_h* h) { return be->ps_barrier(w, o, h); });
  }
  Result finish_worker(dt_comm_h w) {
    return call(w, 0, [&](auto* o, dt_work_h* h) { return be->ps_finish(w, o, h); });
  }
};

// The options of a PS communicator made through the core's public API
// (dtrain/ps.h; the PsGrpcPublicApi tests).
inline dtrain::CommOptions ps_options(std::shared_ptr<dtrain::Store> store, dtrain::Role role, int rank, int servers,
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

}  // namespace ps_grpc_test

#define EXPECT_OK(r) EXPECT_EQ((r).status, DT_OK) << (r).error
#define ASSERT_OK(r) ASSERT_EQ((r).status, DT_OK) << (r).error
