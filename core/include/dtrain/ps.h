#pragma once
// The parameter-server client API and the server entry (Paddle's Fleet in
// parameter-server mode: fleet.init(is_collective=False), init_server() /
// run_server() on servers, init_worker() on workers).
//
// A PS job has num_servers servers and num_workers workers (RoleInfo). Tables
// live on the servers: a dense table is one flat f32 vector split evenly over
// the servers, a sparse table maps u64 keys to rows of `dim` f32 values, keys
// hashed over shards and shards over servers. The optimizer rule runs on the
// servers. Everything here goes through a backend with the DT_CAP_PS_* bits
// (ps_grpc); no transport is included.
//
//   auto ps = dtrain::ps::join_ps(job_config, resolve_role(&job_config));  // worker or server
//   if (ps.role == Role::Server) { ps.server->serve(); return 0; }
//   auto emb = ps.worker->sparse_table(TableConfig::from_config(cfg, "embedding"));
//   emb.pull(keys, n, Buffer(rows, n * 8, DType::F32))->wait();  ... emb.push(keys, n, grads)->wait();
//   ps.worker->finish();
//
// Threading: like Communicator. Ops on one PsWorker (all its tables) are
// submitted by one thread at a time; works may be waited on from any thread.
// Unlike collectives, workers need not submit in the same order. Keys and
// buffers are owned by the caller and must stay valid until the op's Work
// completes. Every op has a deadline (CallOptions, else the [ps] timeout) and
// fails with RemoteError naming the server (index and endpoint) when one dies
// or is unreachable, with TimeoutError when the deadline passes (in sync mode
// naming the workers that have not pushed the step), never a silent hang.
// A refused request (wrong dimension, unknown table, over the size limit)
// fails that op with InvalidUsage and leaves the client usable; transport
// failures poison the client as they poison a Communicator.
//
// Checked in the core before the backend sees a call (InvalidUsage, the
// client stays usable): values f32 on the CPU, count == dim (dense) or
// n * dim (sparse), non-null keys when n > 0, the table's kind, a worker's
// op on a worker. A backend without the DT_CAP_PS_* bit an op needs throws
// NotSupported("backend 'gloo' does not support parameter-server tables (ps-dense)").

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/buffer.h"
#include "dtrain/communicator.h"
#include "dtrain/config.h"
#include "dtrain/role_maker.h"
#include "dtrain/work.h"

namespace dtrain {

class Backend;
class Store;
class TcpStoreServer;

namespace detail {
struct CommState;
}

namespace ps {

// Values match DT_PS_* of the plugin ABI.
enum class Mode : int32_t { Sync = 0, Async = 1, Geo = 2 };
enum class TableKind : int32_t { Dense = 0, Sparse = 1 };
enum class Optimizer : int32_t { Sgd = 0, Adagrad = 1, Adam = 2 };
enum class Initializer : int32_t { Constant = 0, Uniform = 1, Normal = 2 };
enum class SaveMode : int32_t { Full = 0, Base = 1, Delta = 2 };
enum class SaveFormat : int32_t { Binary = 0, Text = 1 };
const char* to_string(Mode m);
const char* to_string(Optimizer o);

// The job's PS mode from Paddle's [strategy] names: a_sync = false → Sync;
// a_sync = true with a_sync_configs.k_steps = 0 → Async; k_steps > 0 → Geo.
struct ModeOptions {
  Mode mode = Mode::Sync;
  int geo_k_steps = 0;  // Geo: push deltas and pull every k steps
  // Async, for the Fleet API's modules (dtrain/fleet/ps.h): how many pushes
  // of a table may be in flight while training goes on (Paddle's
  // a_sync_configs.send_queue_size); 0: every push is waited for. The
  // PsWorker itself never waits for a push: its caller decides.
  int send_queue_size = 1;
};

// One table, as declared by the workers (mirrors dt_ps_table_desc_v1_t; see
// that header for the exact semantics of every field). From a job file:
//
//   [ps.tables.embedding]
//   kind = "sparse"            dim = 8
//   optimizer = "adagrad"      learning_rate = 0.05   epsilon = 1e-8  initial_g2sum = 0.0
//   beta1 = 0.9  beta2 = 0.999 (adam)
//   initializer = "uniform"    init_a = -0.01  init_b = 0.01  seed = 7
//   admit_count = 0            admit_probability = 1.0
//   decay_rate = 0.98          nonclk_coeff = 0.1  click_coeff = 1.0
//   delete_threshold = 0.0     delete_after_unseen_days = 30
struct TableConfig {
  // Every field at its default: DTRAIN_PS_TABLE_KEYS (the SDK's
  // dtrain/sdk/ps_table_fields.h) declares each field once, with its type,
  // default and meaning; the members below mirror that list (the core checks
  // at compile time that they are the same fields) and hold no default of
  // their own.
  TableConfig();

  std::string name;
  TableKind kind;
  uint64_t dim;  // required in a job file
  Optimizer optimizer;
  Initializer initializer;
  double learning_rate, beta1, beta2, epsilon, initial_g2sum;
  double init_a, init_b;
  uint64_t seed;
  uint32_t admit_count;
  double admit_probability;
  double decay_rate, nonclk_coeff, click_coeff, delete_threshold;
  uint32_t delete_after_unseen_days;

  // Reads [ps.tables.<name>]; ConfigError names the file, line and key of a
  // bad value (unknown optimizer, dim = 0, probability outside [0, 1]...).
  static TableConfig from_config(const Config& config, const std::string& name);
};

// Declares [ps] and [ps.tables.*] keys in a schema:
//   [ps]  backend = "ps_grpc"   the PS plugin
//         collective = "gloo"   backend of the workers' side communicator
//                               (barriers and metric all-reduces); "" = none
//         timeout_s = 60        default deadline of every PS op
//         checkpoint_dir = ""   where the servers' tables are saved
//         save_on_exit = false  worker 0 saves every table (FULL) into
//                               <checkpoint_dir>/final/ in PsWorker::finish()
//   [ps.tables.<name>]          one table each (TableConfig above); names with
//                               a '.' cannot be written as a TOML table path
void add_ps_keys(ConfigSchema& schema);

// A handle to one table; cheap to copy; valid while its PsWorker lives.
class DenseTable {
 public:
  const std::string& name() const;
  uint64_t dim() const;
  const TableConfig& config() const;
  Mode mode() const;  // the job's mode the table was declared with
  // values.count == dim(), f32. Sync mode: waits for the step this worker
  // last pushed to be applied.
  std::shared_ptr<Work> pull(const Buffer& values, CallOptions o = {});
  // grads.count == dim(), f32 (Geo: deltas, see GeoTable).
  std::shared_ptr<Work> push(const Buffer& grads, CallOptions o = {});
  std::shared_ptr<Work> save(const std::string& dir, SaveMode mode = SaveMode::Full,
                             SaveFormat format = SaveFormat::Binary, CallOptions o = {});
  std::shared_ptr<Work> load(const std::string& dir, CallOptions o = {});

 private:
  friend class PsWorker;
  struct State;
  std::shared_ptr<State> s_;
};

class SparseTable {
 public:
  const std::string& name() const;
  uint64_t dim() const;
  const TableConfig& config() const;
  Mode mode() const;
  // values.count == n * dim(), row-major in key order; keys may repeat.
  std::shared_ptr<Work> pull(const uint64_t* keys, size_t n, const Buffer& values, CallOptions o = {});
  // grads.count == n * dim(); rows of a repeated key are summed. show_click:
  // null (show 1, click 0 per key) or 2 * n floats.
  std::shared_ptr<Work> push(const uint64_t* keys, size_t n, const Buffer& grads, const float* show_click = nullptr,
                             CallOptions o = {});
  std::shared_ptr<Work> save(const std::string& dir, SaveMode mode = SaveMode::Full,
                             SaveFormat format = SaveFormat::Binary, CallOptions o = {});
  std::shared_ptr<Work> load(const std::string& dir, CallOptions o = {});
  // Eviction (see TableConfig); new_day first ages every row by one day.
  std::shared_ptr<Work> shrink(bool new_day = false, CallOptions o = {});

 private:
  friend class PsWorker;
  struct State;
  std::shared_ptr<State> s_;
};

// Where a worker's checkpoints go ([ps] checkpoint_dir, save_on_exit) and
// whether this is a restarted attempt of the job (RoleInfo::restart_count),
// whose tables are then loaded from <dir>/LATEST.
struct CheckpointOptions {
  std::string dir;
  bool save_on_exit = false;
  int restart_count = 0;
};

// A worker's connection to every server.
class PsWorker {
 public:
  explicit PsWorker(std::shared_ptr<detail::CommState> state, ModeOptions mode, CheckpointOptions checkpoints = {});
  // Without finish(), tells the servers this worker leaves (errors are
  // logged) but runs no save_on_exit barrier or save: a worker unwinding from
  // an error must not wait for workers that wait for it.
  ~PsWorker();
  PsWorker(const PsWorker&) = delete;
  PsWorker& operator=(const PsWorker&) = delete;

  int worker_index() const;
  int num_workers() const;
  int num_servers() const;
  const ModeOptions& mode() const;
  // Declare a table on every server; block until all have it (idempotent for
  // the same config; a different config for an existing name is refused
  // naming the field). The config's kind must match the call.
  DenseTable dense_table(const TableConfig& config);
  SparseTable sparse_table(const TableConfig& config);
  // A barrier among the workers, through the servers.
  std::shared_ptr<Work> barrier(CallOptions o = {});
  // Tells every server this worker is done; the servers' serve() returns
  // once every worker has finished. Idempotent. With [ps] save_on_exit,
  // worker 0 first waits for the others (barrier) and saves a checkpoint.
  void finish();
  // Checkpoints for restarts ([ps] checkpoint_dir): every table declared so
  // far is saved FULL into <checkpoint_dir>/step-<step>/, then worker 0
  // writes <checkpoint_dir>/LATEST (atomically) naming it. Every worker calls
  // it at the same step (it contains barriers: all workers' pushes before it
  // are in the checkpoint, none after); the two newest are kept. LATEST holds
  // one line, "step-<N>". Relative directories are made absolute here (the
  // servers may run elsewhere: they need the same path).
  void save_checkpoint(int64_t step);
  // On a restarted job (role.restart_count > 0) with a LATEST checkpoint,
  // each table is loaded from it when declared (by worker 0, the others
  // wait) and this returns its step; else -1.
  int64_t restored_step() const;
  std::shared_ptr<Communicator> communicator() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A server process.
class PsServer {
 public:
  explicit PsServer(std::shared_ptr<detail::CommState> state);
  ~PsServer();
  int server_index() const;
  // Serves until every worker has finished, or stop() is called, or the
  // launcher asks the job to stop (a store key it watches); then returns.
  // Throws if serving failed.
  void serve();
  // Any thread; serve() returns promptly.
  void stop(const std::string& reason = "stopped");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GEO mode on the worker side (Paddle's GeoCommunicator): the worker trains
// a local copy of the rows it touches with plain SGD; every k steps it pushes
// for each touched row delta = (latest - old) / num_workers, sets old +=
// delta, then pulls the rows back and applies latest += server - old;
// old = server. Framework-neutral: rows are f32 buffers it owns.
class GeoSparseTable {
 public:
  GeoSparseTable(SparseTable table, int num_workers, int k_steps);
  // Copies the local rows of keys into out (n * dim floats, row-major);
  // rows not yet local are pulled from the servers first.
  void lookup(const uint64_t* keys, size_t n, float* out);
  // Applies w -= lr * g to the local rows (lr from the table's config).
  void apply(const uint64_t* keys, size_t n, const float* grads);
  // Counts a step; every k steps pushes deltas and pulls the merged rows.
  void step();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

class GeoDenseTable {
 public:
  GeoDenseTable(DenseTable table, int num_workers, int k_steps);
  // The local copy (dim floats); the caller trains it in place.
  float* values();
  void step();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// This process's membership in a PS job: the store, the PS communicator
// (worker or server side) and, for workers, the side collective communicator
// over the workers named by [ps] collective. join_ps blocks until every
// server has published its address (workers) or the server is listening.
//
// Barriers and metric sums among workers: as Paddle runs Gloo beside its PS,
// a worker also joins a collective communicator over the workers only
// (rank = worker index, size = num_workers, name "ps.collective", the
// backend's own table from the job file, [communicator] timeout_s), on the
// backend [ps] collective names ("gloo" by default; "" for none, then
// PsWorker::barrier() through the servers is the only barrier). Use it for
// all-reduces of metrics (AUC counts, loss sums) and for barriers that must
// not load the servers.
//
// Stopping: the servers' serve() returns when every worker has finished, or
// when the launcher sets the key `ps/stop` (value: the reason) at the root of
// the job store (the TcpStore's own key space, outside "run<N>/"), which
// PsServer::serve() polls.
// Roles come from resolve_role(): dtrain's launcher, or Paddle's PS variables
// (TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_PORT, POD_IP,
// PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM) set by hand, in which case server
// 0 serves the store on its listed endpoint.
struct PsJob {
  RoleInfo role;
  std::shared_ptr<TcpStoreServer> store_server;
  std::shared_ptr<Store> store;
  std::shared_ptr<Backend> backend;
  std::unique_ptr<PsWorker> worker;          // workers
  std::unique_ptr<PsServer> server;          // servers
  std::shared_ptr<Communicator> collective;  // workers, when [ps] collective names one
};
// The PS mode (sync, async, GEO) is the job file's [strategy] a_sync keys,
// or `mode` where the caller already holds them (the Fleet API's strategy
// given in code).
PsJob join_ps(const Config& config, const RoleInfo& role);
PsJob join_ps(const Config& config, const RoleInfo& role, const ModeOptions& mode);

// Lower-level factories (tests, the conformance suite, programs that bring
// their own store): options.role, rank, num_servers, num_workers, store and
// job_token must be set; the backend must have the DT_CAP_PS_* bits.
// connect_worker blocks until every server is reachable or options.timeout
// passes; start_server returns once this server listens.
std::unique_ptr<PsWorker> connect_worker(const std::shared_ptr<Backend>& backend, const CommOptions& options,
                                         ModeOptions mode, CheckpointOptions checkpoints = {});
std::unique_ptr<PsServer> start_server(const std::shared_ptr<Backend>& backend, const CommOptions& options);

}  // namespace ps
}  // namespace dtrain
