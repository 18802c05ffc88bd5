// PsWorker: table declaration, barrier, finish, checkpoints; connect_worker.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "common/log.h"
#include "dtrain/error.h"
#include "plugin/backend_impl.h"
#include "ps/ps_internal.h"
#include "ps/table_desc.h"

namespace fs = std::filesystem;

namespace dtrain::ps {

using detail::require_cap;
using detail::submit_ps;
using detail::TableState;
using detail::to_desc;
using dtrain::detail::CommState;

struct PsWorker::Impl {
  std::shared_ptr<CommState> comm;
  ModeOptions mode;
  CheckpointOptions ckpt;
  std::shared_ptr<std::atomic<bool>> finished = std::make_shared<std::atomic<bool>>(false);
  bool finishing = false;
  std::vector<std::shared_ptr<TableState>> tables;
  std::string restore_dir;  // <dir>/step-<N> on a restarted job
  int64_t restored_step = -1;
  int64_t checkpoints = 0;  // save_checkpoint calls, the same count on every worker

  std::shared_ptr<TableState> declare(const TableConfig& c, TableKind kind, std::shared_ptr<TableState> t);
  std::shared_ptr<Work> barrier(CallOptions o);
  void finish(bool save);
  void restore(const std::shared_ptr<TableState>& t);
  void save_all(const std::string& dir);
};

namespace {

const char* kind_name(TableKind k) { return k == TableKind::Dense ? "dense" : "sparse"; }

// "step-<N>" -> N, else -1.
int64_t step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  int64_t n = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || n > (INT64_MAX - 9) / 10) return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

void fsync_path(const fs::path& p, int flags) {
  int fd = ::open(p.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes <dir>/LATEST = "step-<N>" atomically: a reader sees the old or the new one.
void write_latest(const fs::path& dir, const std::string& target) {
  fs::path tmp = dir / ("LATEST.tmp." + std::to_string(::getpid()));
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << target << "\n";
    f.flush();
    if (!f) throw IoError("cannot write " + tmp.string());
  }
  fsync_path(tmp, O_RDONLY);
  std::error_code ec;
  fs::rename(tmp, dir / "LATEST", ec);
  if (ec) throw IoError("cannot rename " + tmp.string() + " to LATEST: " + ec.message());
  fsync_path(dir, O_RDONLY | O_DIRECTORY);
}

// Keeps step-<step> and the newest older one; removes every other step-* folder.
void prune_checkpoints(const fs::path& dir, int64_t step) {
  std::vector<int64_t> older;
  std::vector<fs::path> drop;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    int64_t n = step_of(e.path().filename().string());
    if (n < 0 || n == step || !e.is_directory()) continue;
    if (n < step)
      older.push_back(n);
    else
      drop.push_back(e.path());
  }
  std::sort(older.begin(), older.end());
  for (size_t i = 0; i + 1 < older.size(); ++i) drop.push_back(dir / ("step-" + std::to_string(older[i])));
  for (auto& p : drop) {
    fs::remove_all(p, ec);
    if (ec) dtrain::detail::logger().warn("cannot remove the old checkpoint {}: {}", p.string(), ec.message());
  }
}

}  // namespace

PsWorker::PsWorker(std::shared_ptr<CommState> state, ModeOptions mode, CheckpointOptions checkpoints)
    : impl_(std::make_unique<Impl>()) {
  if (!state || !state->ps || state->role != Role::Worker)
    throw InvalidUsage("PsWorker needs a parameter-server communicator created with role worker");
  if (mode.mode == Mode::Geo && mode.geo_k_steps < 1)
    throw InvalidUsage("GEO mode needs a_sync_configs.k_steps >= 1, got " + std::to_string(mode.geo_k_steps));
  impl_->comm = std::move(state);
  impl_->mode = mode;
  impl_->ckpt = std::move(checkpoints);
  if (impl_->ckpt.dir.empty()) return;
  impl_->ckpt.dir = detail::absolute_dir(impl_->ckpt.dir, "checkpoint_dir");
  if (impl_->ckpt.restart_count <= 0) return;
  fs::path latest = fs::path(impl_->ckpt.dir) / "LATEST";
  std::ifstream f(latest);
  std::string name;
  if (!(f >> name)) {
    dtrain::detail::logger().info("worker {}: restart {} finds no checkpoint ({} is absent); tables start fresh",
                                  impl_->comm->rank, impl_->ckpt.restart_count, latest.string());
    return;
  }
  int64_t step = step_of(name);
  if (step < 0) throw IoError(latest.string() + " names '" + name + "', not a step-<N> checkpoint");
  impl_->restore_dir = (fs::path(impl_->ckpt.dir) / name).string();
  impl_->restored_step = step;
  dtrain::detail::logger().info("worker {}: restart {} restores the tables from {}", impl_->comm->rank,
                                impl_->ckpt.restart_count, impl_->restore_dir);
}

PsWorker::~PsWorker() {
  try {
    if (!impl_->finishing && impl_->ckpt.save_on_exit && !impl_->tables.empty())
      dtrain::detail::logger().warn("worker {}: left without finish(): [ps] save_on_exit saves nothing",
                                    impl_->comm->rank);
    impl_->finish(false);
  } catch (const std::exception& e) {
    dtrain::detail::logger().error("worker {}: finishing the parameter-server client failed: {}", impl_->comm->rank,
                                   e.what());
  }
}

int PsWorker::worker_index() const { return impl_->comm->rank; }
int PsWorker::num_workers() const { return impl_->comm->size; }
int PsWorker::num_servers() const { return impl_->comm->num_servers; }
const ModeOptions& PsWorker::mode() const { return impl_->mode; }
int64_t PsWorker::restored_step() const { return impl_->restored_step; }
std::shared_ptr<Communicator> PsWorker::communicator() const { return std::make_shared<Communicator>(impl_->comm); }

std::shared_ptr<TableState> PsWorker::Impl::declare(const TableConfig& c, TableKind kind,
                                                    std::shared_ptr<TableState> t) {
  const char* op = kind == TableKind::Dense ? "dense_table" : "sparse_table";
  if (finished->load()) throw InvalidUsage(std::string(op) + ": this worker has finished");
  if (!valid_table_name(c.name))
    throw InvalidUsage(std::string(op) + ": table name '" + c.name + "' must be 1-200 of [A-Za-z0-9_.-]");
  if (c.kind != kind)
    throw InvalidUsage(std::string(op) + ": table '" + c.name + "' is kind = \"" + kind_name(c.kind) +
                       "\" in its config; declare it with " + (c.kind == TableKind::Dense ? "dense" : "sparse") +
                       "_table()");
  if (c.dim == 0) throw InvalidUsage(std::string(op) + ": table '" + c.name + "' has dim = 0");
  if (mode.mode == Mode::Geo && c.optimizer != Optimizer::Sgd)
    throw InvalidUsage(std::string(op) + ": table '" + c.name + "' has optimizer = \"" + to_string(c.optimizer) +
                       "\", but GEO mode (a_sync_configs.k_steps = " + std::to_string(mode.geo_k_steps) +
                       ") trains with SGD on the workers and accepts only optimizer = \"sgd\", as Paddle's");
  require_cap(*comm, kind == TableKind::Dense ? DT_CAP_PS_DENSE : DT_CAP_PS_SPARSE);
  for (auto& old : tables)
    if (old->config.name == c.name && old->config.kind != kind)
      throw InvalidUsage(std::string(op) + ": table '" + c.name + "' is already declared as a " +
                         kind_name(old->config.kind) + " table");
  t->comm = comm;
  t->config = c;
  t->mode = mode.mode;
  t->finished = finished;
  dt_ps_table_desc_v1_t desc = to_desc(c, mode.mode);
  auto& s = *comm;
  uint32_t id = 0;
  submit_ps(
      comm, "ps_table", DT_CAP_PS_SERVER,
      "table '" + c.name + "', " + kind_name(kind) + " dim " + std::to_string(c.dim) + ", " + to_string(mode.mode),
      CallOptions{}, [&](auto& opts, dt_work_h* h) { return s.table->ps_table(s.handle, &desc, &id, &opts, h); })
      ->wait();
  t->id = id;
  bool known = false;
  for (auto& old : tables) known |= old->config.name == c.name;
  if (!known) tables.push_back(t);
  if (!restore_dir.empty() && !known) restore(t);
  return t;
}

void PsWorker::Impl::restore(const std::shared_ptr<TableState>& t) {
  const std::string& name = t->config.name;
  std::string key = "checkpoint/" + name;
  if (comm->rank != 0) {
    std::string v = comm->store->get_string(key, comm->timeout);
    if (v.rfind("error", 0) == 0)
      throw RemoteError("worker 0 could not restore table '" + name + "' from " + restore_dir + ": " + v);
    return;
  }
  fs::path manifest = fs::path(restore_dir) / name / "MANIFEST";
  std::error_code ec;
  if (!fs::exists(manifest, ec)) {
    dtrain::detail::logger().warn("checkpoint {} has no table '{}' ({} is absent); it starts fresh", restore_dir, name,
                                  manifest.string());
    comm->store->set(key, std::string("absent"));
    return;
  }
  try {
    detail::load_op(t, restore_dir, CallOptions{})->wait();
  } catch (const std::exception& e) {
    comm->store->set(key, std::string("error: ") + e.what());
    throw;
  }
  comm->store->set(key, std::string("ok"));
  dtrain::detail::logger().info("worker 0: table '{}' restored from {}", name, restore_dir);
}

DenseTable PsWorker::dense_table(const TableConfig& config) {
  DenseTable t;
  t.s_ = std::make_shared<DenseTable::State>();
  impl_->declare(config, TableKind::Dense, t.s_);
  return t;
}

SparseTable PsWorker::sparse_table(const TableConfig& config) {
  SparseTable t;
  t.s_ = std::make_shared<SparseTable::State>();
  impl_->declare(config, TableKind::Sparse, t.s_);
  return t;
}

std::shared_ptr<Work> PsWorker::barrier(CallOptions o) { return impl_->barrier(o); }

std::shared_ptr<Work> PsWorker::Impl::barrier(CallOptions o) {
  if (finished->load()) throw InvalidUsage("barrier: this worker has finished");
  auto& s = *comm;
  require_cap(s, DT_CAP_PS_SERVER);
  return submit_ps(comm, "ps_barrier", DT_CAP_PS_SERVER, "", o,
                   [&](auto& opts, dt_work_h* h) { return s.table->ps_barrier(s.handle, &opts, h); });
}

void PsWorker::Impl::save_all(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create the checkpoint folder " + dir + ": " + ec.message());
  std::vector<std::shared_ptr<Work>> works;
  for (auto& t : tables) works.push_back(detail::save_op(t, dir, SaveMode::Full, SaveFormat::Binary, CallOptions{}));
  for (auto& w : works) w->wait();
}

void PsWorker::save_checkpoint(int64_t step) {
  auto& im = *impl_;
  if (im.ckpt.dir.empty()) throw InvalidUsage("save_checkpoint: no checkpoint directory; set [ps] checkpoint_dir");
  if (step < 0) throw InvalidUsage("save_checkpoint: step must be >= 0, got " + std::to_string(step));
  barrier()->wait();
  // Worker 0 saves; its outcome reaches the others through the store, so a
  // failed save fails every worker with worker 0's reason.
  std::string name = "step-" + std::to_string(step);
  std::string key = "checkpoint/saved/" + std::to_string(++im.checkpoints);
  std::exception_ptr failed;
  if (im.comm->rank == 0) {
    try {
      im.save_all((fs::path(im.ckpt.dir) / name).string());
      write_latest(im.ckpt.dir, name);
      prune_checkpoints(im.ckpt.dir, step);
      im.comm->store->set(key, std::string("ok"));
      dtrain::detail::logger().info("worker 0: checkpoint {} of {} tables saved in {}", name, im.tables.size(),
                                    im.ckpt.dir);
    } catch (const std::exception& e) {
      failed = std::current_exception();
      im.comm->store->set(key, std::string("error: ") + e.what());
    }
  }
  barrier()->wait();
  if (failed) std::rethrow_exception(failed);
  std::string v = im.comm->store->get_string(key, im.comm->timeout);
  if (v != "ok") throw RemoteError("worker 0 could not save checkpoint " + name + " in " + im.ckpt.dir + ": " + v);
}

void PsWorker::finish() { impl_->finish(true); }

void PsWorker::Impl::finish(bool save) {
  auto& im = *this;
  if (im.finishing) return;
  im.finishing = true;
  if (im.comm->poisoned.load()) {
    im.finished->store(true);
    return;
  }
  auto& s = *im.comm;
  require_cap(s, DT_CAP_PS_SERVER);
  if (save && im.ckpt.save_on_exit && !im.ckpt.dir.empty() && !im.tables.empty()) {
    im.barrier({})->wait();
    if (s.rank == 0) {
      std::string dir = (fs::path(im.ckpt.dir) / "final").string();
      im.save_all(dir);
      dtrain::detail::logger().info("worker 0: {} tables saved in {} (save_on_exit)", im.tables.size(), dir);
    }
  }
  im.finished->store(true);
  submit_ps(im.comm, "ps_finish", DT_CAP_PS_SERVER, "", CallOptions{}, [&](auto& opts, dt_work_h* h) {
    return s.table->ps_finish(s.handle, &opts, h);
  })->wait();
}

std::unique_ptr<PsWorker> connect_worker(const std::shared_ptr<Backend>& backend, const CommOptions& options,
                                         ModeOptions mode, CheckpointOptions checkpoints) {
  if (!backend) throw InvalidUsage("connect_worker: no backend");
  if (options.role != Role::Worker) throw InvalidUsage("connect_worker: options.role must be worker");
  if (options.num_servers < 1 || options.num_workers < 1)
    throw InvalidUsage("connect_worker: options.num_servers and options.num_workers must be >= 1 (got " +
                       std::to_string(options.num_servers) + " and " + std::to_string(options.num_workers) + ")");
  auto state = dtrain::detail::create_comm_state(backend, options);
  return std::make_unique<PsWorker>(std::move(state), mode, std::move(checkpoints));
}

}  // namespace dtrain::ps
