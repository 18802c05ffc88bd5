#pragma once

// The parameter-server half of the Fleet API (Paddle's fleet.init(is_collective
// =False), init_server / run_server on servers, init_worker / stop_worker on
// workers), on dtrain/ps.h.
//
//   namespace fleet = dtrain::fleet;
//   fleet::init(false);                                   // reads [ps], [strategy]
//   if (fleet::is_server()) { fleet::init_server(); fleet::run_server(); return 0; }
//   fleet::init_worker();
//   fleet::SparseEmbedding emb(fleet::sparse_table_config("embedding"));
//   auto mlp = torch::nn::Sequential(...);
//   auto opt = fleet::ps_optimizer({emb}, mlp);            // dense weights live on the servers
//   for (...) { auto loss = f(mlp->forward(emb(ids))); loss.backward(); opt->step(); opt->zero_grad(); }
//   fleet::stop_worker();
//
// Modes come from [strategy] (a_sync, a_sync_configs.k_steps): Sync, Async or
// Geo (dtrain/ps.h). In Sync and Async the servers apply each table's
// optimizer rule; in Geo the worker trains local copies with SGD at the
// table's learning rate and exchanges deltas every k steps.
//
// Threads: everything here is called from the training thread. Workers need
// not call in the same order, except barrier_worker and the metrics, which go
// through the workers' side communicator ([ps] collective, default gloo).

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "dtrain/ps.h"
#include "dtrain/store.h"
#include "dtrain/work.h"

namespace dtrain::fleet {

namespace detail {
class InFlight;
}

// One process that is its own parameter server: the PS backend of config's
// [ps] (default ps_grpc) is loaded, one server runs in this process on a
// memory store and this process is its only worker, in async mode. For
// inference on saved tables (load them with SparseTable/DenseParameters::load)
// and for tests. send_queue_size as a_sync_configs' (0: every push is waited
// for). Like init(false), once per process until shutdown().
void init_standalone(std::shared_ptr<const Config> config, int send_queue_size = 0);

// The role of this process in a PS job (after init(false)).
bool is_server();
bool is_worker();
int server_index();
int server_num();

// fleet.init_server(): checks this is a server (it already listens after
// init). Saved tables are loaded by the workers: SparseTable/DenseTable::load,
// or [ps] checkpoint_dir on a restart. fleet.run_server(): blocks until every
// worker has called stop_worker() (or exited under the launcher), then returns.
void init_server();
void run_server();
// fleet.init_worker(): connects to every server (init already did; kept for
// Paddle's call order). fleet.stop_worker(): tells the servers this worker is
// done; with [ps] save_on_exit worker 0 saves first.
void init_worker();
void stop_worker();

// fleet.save_persistables / load_persistables: saves (loads) every table the
// worker's SparseEmbedding and DenseParameters declared into (from) dir, one
// folder per table (dtrain/ps.h's save: atomic, loadable onto any number of
// servers). Saving is not collective: call it on one worker
// (is_first_worker()) after a barrier_worker() when every worker's pushes must
// be in. Loading, on one worker too, then barrier_worker() and pull (the
// modules' next forward and DenseParameters::pull see the loaded values).
void save_persistables(const std::string& dir, ps::SaveMode mode = ps::SaveMode::Full,
                       ps::SaveFormat format = ps::SaveFormat::Binary);
void load_persistables(const std::string& dir);

// The worker's PS client (throws before init(false) or on a server).
ps::PsWorker& ps_worker();
// The store init(false) joined the job through (workers and servers), for a
// program's own keys beside the job's (dtrain.fleet: init_server(dirname)).
std::shared_ptr<Store> ps_store();
const ps::ModeOptions& ps_mode();
// [ps.tables.<name>] of the job file.
ps::TableConfig sparse_table_config(const std::string& name);

// An embedding whose rows live in a sparse PS table: forward(ids) pulls the
// rows of ids (int64, any shape) and returns a tensor of shape ids.shape +
// [dim] that requires grad; the gradients of every forward since the last
// PsOptimizer::step() are pushed by that step (rows of repeated ids summed).
// A pull asks for each distinct id once, and a push sends each id once (its
// rows, shows and clicks summed on the worker, as a server would sum them).
// show_click (float, ids.numel() x 2, optional) feeds the table's counters.
//
// Async mode with a_sync_configs.send_queue_size = q > 0 overlaps the
// table's traffic with training, as Paddle's async communicator does: a push
// is left in flight (the step waits only while q pushes are), and
// prefetch(next_ids) pulls the next batch's rows while this batch computes.
// Rows may then miss this worker's last q pushes (a pull not prefetched
// still sees every push of this worker). Sync and GEO keep their semantics:
// there every push is waited for and prefetch does nothing.
class SparseEmbeddingImpl : public ::torch::nn::Module {
 public:
  explicit SparseEmbeddingImpl(const ps::TableConfig& config);
  // Waits for the ops in flight (their buffers are this module's).
  ~SparseEmbeddingImpl() override;
  ::torch::Tensor forward(const ::torch::Tensor& ids, const ::torch::Tensor& show_click = {});
  // Starts pulling the rows of ids now (async with send_queue_size > 0, else
  // nothing); the next forward whose ids are the same takes them. A prefetch
  // not taken is waited for and dropped by the next forward or prefetch.
  void prefetch(const ::torch::Tensor& ids);
  int64_t dim() const { return dim_; }
  ps::SparseTable& table() { return table_; }
  // Pushes the gradients gathered since the last call (Sync/Async), or
  // applies them to the local copy and counts a GEO step. Called by
  // PsOptimizer::step(). A push left in flight fails the call that next
  // waits for it (a later step, flush, barrier_worker).
  void push_gradients();
  // Waits for this module's pushes in flight.
  void flush();
  // Drops gathered lookups without pushing (e.g. after an evaluation pass).
  void clear();

 private:
  struct Lookup {
    std::vector<uint64_t> keys;
    ::torch::Tensor rows;
    ::torch::Tensor show_click;
  };
  struct Prefetch {
    std::vector<uint64_t> keys;
    std::vector<uint64_t> distinct;  // pulled: keys without repeats, in order of first appearance
    std::vector<uint32_t> at;        // keys[i] == distinct[at[i]]
    ::torch::Tensor rows;            // [distinct.size(), dim]
    std::shared_ptr<Work> work;
  };
  void drop_prefetch();

  ps::SparseTable table_;
  std::unique_ptr<ps::GeoSparseTable> geo_;
  int64_t dim_ = 0;
  size_t queue_ = 0;  // pushes that may be in flight (async only)
  std::vector<Lookup> lookups_;
  std::unique_ptr<Prefetch> prefetch_;
  std::shared_ptr<detail::InFlight> pushes_;
};
// TORCH_MODULE(SparseEmbedding), spelled out: inside dtrain::fleet the macro's
// unqualified torch:: would name this namespace.
class SparseEmbedding : public ::torch::nn::ModuleHolder<SparseEmbeddingImpl> {
 public:
  using ::torch::nn::ModuleHolder<SparseEmbeddingImpl>::ModuleHolder;
  using Impl = SparseEmbeddingImpl;
};

// The dense parameters of `model` on the servers: one dense table per
// parameter, named "<prefix>.<parameter name>" (dots kept, other characters
// outside [A-Za-z0-9_.-] replaced by '_'), with the rule, rate and hyper-
// parameters of `config` and an initializer taken from the parameter's shape,
// so every worker starts from the same values: a tensor of 2 or more
// dimensions uniform in +-1/sqrt(fan_in) (libtorch's Linear/Conv default), a
// 1-D tensor named "...bias" 0, another 1-D tensor its local value where
// that is one constant (BatchNorm's weight 1), else 0. The values are pulled into the
// parameters at construction.
class DenseParameters {
 public:
  DenseParameters(std::shared_ptr<::torch::nn::Module> model, const ps::TableConfig& config,
                  const std::string& prefix = "dense");
  uint64_t count() const { return count_; }
  // Pushes the gradients, then pulls the new values into the parameters
  // (Sync/Async); Geo: SGD on the local values and a GEO step. Async with
  // send_queue_size > 0: the push and the pull run while training goes on,
  // and the values pulled are copied into the parameters by the next step()
  // (one step later than without).
  void step();
  // Pulls the servers' values into the parameters (after the ops in flight).
  void pull();
  // Waits for the ops in flight and copies in the values they pulled.
  void flush();
  // Loads every parameter's table from dir (as saved by a checkpoint or
  // DenseTable::save), then pulls.
  void load(const std::string& dir);

 private:
  struct Param {
    ::torch::Tensor tensor;
    ps::DenseTable table;
    std::unique_ptr<ps::GeoDenseTable> geo;
  };
  void copy_in_staged();

  std::shared_ptr<::torch::nn::Module> model_;
  std::vector<Param> params_;
  double lr_ = 0;
  uint64_t count_ = 0;
  bool overlap_ = false;                 // async with send_queue_size > 0
  std::vector<::torch::Tensor> staged_;  // overlap: the values the last step pulled
  bool staged_pending_ = false;          // staged_ not yet copied in
  std::shared_ptr<detail::InFlight> ops_;
};

// fleet.distributed_optimizer in PS mode: step() pushes every embedding's
// gradients and the dense model's gradients, and brings back the new values;
// zero_grad() clears the dense gradients. The servers own the optimizer
// state; there is no local optimizer.
class PsOptimizer {
 public:
  // model: whose gradients zero_grad() clears (may be null).
  PsOptimizer(std::vector<SparseEmbedding> embeddings, std::shared_ptr<::torch::nn::Module> model,
              std::shared_ptr<DenseParameters> dense);
  void step();
  void zero_grad();
  // Waits for every push and pull the steps left in flight (async).
  void flush();
  int64_t steps() const { return steps_; }
  const std::shared_ptr<DenseParameters>& dense() const { return dense_; }

 private:
  std::vector<SparseEmbedding> embeddings_;
  std::shared_ptr<::torch::nn::Module> model_;
  std::shared_ptr<DenseParameters> dense_;
  int64_t steps_ = 0;
};
// Puts `model`'s parameters on the servers (DenseParameters with
// [ps.tables.<dense_table>] if the job file has it, else SGD at 0.01) and
// makes the optimizer over them and the embeddings.
std::shared_ptr<PsOptimizer> ps_optimizer(std::vector<SparseEmbedding> embeddings,
                                          std::shared_ptr<::torch::nn::Module> model,
                                          const std::string& dense_table = "dense");

}  // namespace dtrain::fleet
