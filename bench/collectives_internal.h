#pragma once
// Internals of `dtrain-bench collectives`, shared by its files: the plan
// (collectives_plan.cc), the ranks (collectives_ranks.cc), the Open MPI
// driver (collectives_mpi.cc), the table (collectives_table.cc) and the
// parent that runs them all (collectives.cc).

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "collectives.h"
#include "dtrain/buffer.h"
#include "dtrain/store.h"
#include "gloo_reference.h"
#include "stats.h"  // Clock, seconds_since, median

namespace dtrain::bench::coll {

inline constexpr const char* kWorkerEnv = "DTRAIN_BENCH_WORKER";  // "rank:world:host:port"
inline constexpr const char* kTokenEnv = "DTRAIN_BENCH_TOKEN";
// Set for the ranks when Open MPI's ranks run beside them, taking turns.
inline constexpr const char* kMpiPairedEnv = "DTRAIN_BENCH_MPI_PAIRED";
inline constexpr size_t kSmallBytes = 64 * 1024;  // rows that show the latency difference
inline constexpr size_t kLargeBytes = 1 << 20;    // rows the bandwidth target applies to
inline constexpr double kTrialBudgetS = 1.2;      // --trials auto: time per size for both implementations

enum class Op { Allreduce, Broadcast, Allgather };
Op parse_op(const std::string& s);
const char* op_name(Op op);
// "8", "4K", "64M", "1G" (binary units) to bytes.
size_t parse_size(const std::string& text);
std::string human_bytes(size_t b);
std::string unquote(const std::string& v);

struct Case {
  size_t bytes = 0;  // the size column: the op's buffer (allgather: the gathered result)
  size_t count = 0;  // elements per call (allgather: per rank)
};

struct Plan {
  Op op = Op::Allreduce;
  DType dtype = DType::F32;
  int world = 2;
  std::vector<Case> cases;
  int fixed_iters = 0;  // 0: auto
  std::string config_toml;
  std::string options_text;  // for the header
  GlooRefConfig gloo;
  double busbw_factor = 1;
  std::string gloo_skip;  // why there is no raw-Gloo reference ("" when there is)
  // --backend nccl: the bench's buffers are CUDA memory, and raw NCCL
  // (nccl_reference.h) is the reference; nccl_skip says why it does not run.
  bool cuda = false;
  int cuda_device = -1;  // the backend option `device`, -1: rank modulo the visible devices
  std::string nccl_skip = "not --backend nccl";
};

Plan make_plan(const CollectivesOptions& o);

struct Row {
  Case c;
  int iters = 0, trials = 0;
  std::optional<double> dtrain, gloo, mpi, nccl;  // seconds per op (median trial)
  std::vector<double> dtrain_trials, gloo_trials, mpi_trials, nccl_trials;

  // dtrain against raw Gloo, trial by trial: trial k of both ran back to back,
  // so the machine's slow drift cancels out in each pair.
  std::optional<double> paired(bool ratio) const {
    size_t n = std::min(dtrain_trials.size(), gloo_trials.size());
    if (!n) return std::nullopt;
    std::vector<double> v;
    for (size_t k = 0; k < n; ++k)
      v.push_back(ratio ? gloo_trials[k] / dtrain_trials[k] : dtrain_trials[k] - gloo_trials[k]);
    return median(v);
  }
};

// The store as a barrier (outside every timed region).
void store_barrier(Store& s, const std::string& name, int rank, int world);
// One rank, started by the parent with spec "rank:world:host:port".
int worker_main(const CollectivesOptions& o, const Plan& p, const std::string& spec);
// How Open MPI's ranks (dtrain-bench-mpi under mpirun) are started beside
// dtrain's, taking turns with them through the store at store_at
// (collectives_turns.h); mpirun empty when they are not, with the reason in note.
struct MpiPlan {
  std::string mpirun;
  std::vector<std::string> argv, env;
  std::string note;  // for the header
};
MpiPlan plan_mpi(const CollectivesOptions& o, const Plan& p, const std::string& store_at);
void print_table(const CollectivesOptions& o, const Plan& p, const std::vector<Row>& rows, bool gloo_on, bool mpi_on);
// --backend nccl: dtrain against raw NCCL, per size the pooled ratio with its
// 95% interval, the paired difference, and the target (within 5% or 2 us).
void print_nccl_table(const CollectivesOptions& o, const Plan& p, const std::vector<Row>& rows);
inline constexpr double kNcclTargetRatio = 1.05;  // dtrain's time at most 5% above raw NCCL's ...
inline constexpr double kNcclTargetUs = 2;        // ... or at most 2 us above it

}  // namespace dtrain::bench::coll
