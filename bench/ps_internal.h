#pragma once
// Internals of `dtrain-bench ps`, shared by its files: the plan and the rows
// (ps_plan.cc), the parent (ps.cc), the worker and the dtrain side
// (ps_worker.cc), the raw-gRPC reference (ps_echo.cc), the Redis reference
// (ps_redis.cc).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ps.h"
#include "dtrain/store.h"
#include "stats.h"  // Clock, seconds_since, median

namespace dtrain::bench::psb {

inline constexpr const char* kRoleEnv = "DTRAIN_BENCH_PS";  // "role:index:host:port", role server|worker|echo
inline constexpr const char* kTokenEnv = "DTRAIN_BENCH_TOKEN";
// A throughput trial runs the implementations interleaved in this many rounds (ps_worker.cc).
inline constexpr int kTrialRounds = 4;

enum class Op { SparsePull, SparsePush, DensePull, DensePush };
const char* op_name(Op op);

struct Row {
  Op op = Op::SparsePull;
  bool latency = false;  // per-call latency of many small calls (median, p99)
  size_t dim = 0;        // sparse
  size_t keys = 0;       // sparse: keys per call
  size_t count = 0;      // dense: floats per call
  bool sparse() const { return op == Op::SparsePull || op == Op::SparsePush; }
  // Payload bytes of one call, both directions: keys + rows (sparse), values (dense).
  size_t bytes() const { return sparse() ? keys * (8 + dim * 4) : count * 4; }
  std::string label() const;
};

// "1K", "64M" (binary units) to a number.
size_t parse_size(const std::string& text);
std::string human(size_t n, bool bytes);
std::vector<Row> make_rows(const PsBenchOptions& o);

// One implementation of the four operations, as a worker drives it. Every
// call is synchronous: it returns when the data has arrived or was accepted.
class Impl {
 public:
  virtual ~Impl() = default;
  virtual void sparse_pull(const uint64_t* keys, size_t n, size_t dim, float* out) = 0;
  virtual void sparse_push(const uint64_t* keys, size_t n, size_t dim, const float* grads) = 0;
  virtual void dense_pull(float* out, size_t count) = 0;
  virtual void dense_push(const float* grads, size_t count) = 0;
  virtual void finish() {}
};

// The raw-gRPC reference: `servers` echo servers (ps_echo.cc), the payload
// split over them evenly and into messages of at most chunk_bytes, every
// message of a call in flight at once (async client, one completion queue).
std::unique_ptr<Impl> make_grpc_impl(const std::vector<std::string>& endpoints, size_t chunk_bytes);
// An echo server process: listens on 127.0.0.1 (port 0), publishes
// "echo/<index>" = host:port, serves until the key "stop" appears.
int echo_server_main(Store& store, int index, size_t chunk_bytes);

// The Redis reference: rows as hash fields (HSET table key row), pulls as
// pipelined HMGET, pushes as pipelined HSET of the row, in batches of keys,
// split over one redis-server per PS server; dense as GET/SET of one string
// per server.
std::unique_ptr<Impl> make_redis_impl(const std::vector<int>& ports);
// A redis-server on a free loopback port, no persistence; stopped (SHUTDOWN
// NOSAVE, then SIGKILL) when destroyed.
class RedisServer {
 public:
  explicit RedisServer(const std::string& exe);
  ~RedisServer();
  int port() const { return port_; }

 private:
  int pid_ = -1, port_ = 0;
};

// The dtrain side (ps_worker.cc): a PS worker on the backend, async mode, SGD
// tables created on first use (sparse per dim, dense per size).
std::unique_ptr<Impl> make_dtrain_impl(const PsBenchOptions& o, const std::shared_ptr<Store>& store, int worker,
                                       const std::string& token);
int server_main(const PsBenchOptions& o, const std::shared_ptr<Store>& store, int index, const std::string& token);
int worker_main(const PsBenchOptions& o, const std::shared_ptr<Store>& store, int index, const std::string& token);

std::string config_toml(const PsBenchOptions& o);
void store_barrier(Store& s, const std::string& name, int rank, int world);

}  // namespace dtrain::bench::psb
