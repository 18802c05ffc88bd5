#include "collectives.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "collectives_internal.h"
#include "dtrain/job_token.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"
#include "machine.h"
#ifdef DTRAIN_BENCH_HAVE_NCCL
#include "nccl_reference.h"
#endif
#include "process.h"

namespace dtrain::bench {

namespace coll {
namespace {

// ---------------------------------------------------------------- the parent

// CPU seconds of this process and of its children reaped so far.
double own_cpu_seconds() {
  auto secs = [](const rusage& u) {
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
  };
  rusage self{}, kids{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &kids);
  return secs(self) + secs(kids);
}

// Per trial the slowest rank; the median trial is the figure that repeats on a
// shared machine where single trials swing both ways.
std::vector<double> collect(Store& s, const std::string& impl, size_t i, int world) {
  std::vector<double> worst;
  for (int r = 0; r < world; ++r) {
    auto v = s.try_get(fmt::format("res/{}/{}/{}", impl, i, r));
    if (!v) return {};
    std::istringstream is(std::string(v->begin(), v->end()));
    double x;
    for (size_t t = 0; is >> x; ++t) {
      if (worst.size() <= t)
        worst.push_back(x);
      else
        worst[t] = std::max(worst[t], x);
    }
  }
  return worst;
}

// --backend nccl: how the ranks reach their GPUs (throws, before any rank
// starts, when none is visible). Empty without --backend nccl.
struct CudaRanks {
  std::vector<std::string> rank_env;  // added to every rank's environment
  bool hostid_per_rank = false;       // ranks share a GPU: each an NCCL "host" of its own
  std::string note;                   // for the header
};

CudaRanks cuda_ranks([[maybe_unused]] const Plan& p) {
  CudaRanks c;
#ifdef DTRAIN_BENCH_HAVE_NCCL
  if (p.cuda) {
    int visible = 0;
    try {
      visible = cuda_devices_or_throw();
    } catch (const NotSupported& e) {
      throw NotSupported(fmt::format(
          "--backend nccl runs on CUDA buffers, but {}; benchmark --backend gloo or --backend ucx on this machine",
          e.what()));
    }
    // Ranks sharing a GPU: NCCL refuses two ranks of one host on one device, so
    // each rank is a "host" of its own (NCCL_HOSTID) talking over loopback sockets.
    bool shared = p.cuda_device >= 0 ? p.world > 1 : p.world > visible;
    if (shared) {
      const char* ifname = std::getenv("NCCL_SOCKET_IFNAME");
      if (!ifname) c.rank_env.push_back("NCCL_SOCKET_IFNAME=lo");
      c.note = fmt::format(
          "{} ranks share {} GPU(s): each sets its own NCCL_HOSTID, so NCCL connects them over sockets on {} "
          "(slow; real multi-rank NCCL, not a bandwidth figure)",
          p.world, p.cuda_device >= 0 ? 1 : visible, ifname ? ifname : "lo");
    } else {
      c.note = p.cuda_device >= 0 ? fmt::format("every rank on cuda:{}", p.cuda_device)
                                  : fmt::format("rank r on cuda:r ({} visible)", visible);
    }
    c.note += "; " + nccl_reference_versions();
    c.hostid_per_rank = shared;
  }
#endif
  return c;
}

// The table's header: what runs, on what, and what the columns mean.
void print_header(const CollectivesOptions& o, const Plan& p, const std::string& cuda_note) {
  bool gloo_on = p.gloo_skip.empty();
  bool nccl_on = p.cuda && p.nccl_skip.empty();
  fmt::print("# dtrain-bench collectives: {} {}{}, {} ranks as processes on this host, backend '{}'{}\n", op_name(p.op),
             dtype_name(p.dtype), p.op == Op::Allreduce ? " (sum)" : "", p.world, o.backend,
             p.options_text.empty() ? "" : " with " + p.options_text);
  fmt::print("# sizes {} .. {} (x{}), warm-up {}, iterations {}, median of {} trial(s){}\n",
             human_bytes(p.cases.front().bytes), human_bytes(p.cases.back().bytes), o.step_factor, o.warmup,
             p.fixed_iters ? std::to_string(p.fixed_iters)
                           : fmt::format("auto (~{:g} ms per trial, >= 5, each implementation from its own warm-up)",
                                         o.target_ms),
             o.trials ? std::to_string(o.trials) : fmt::format("7-61 (~{:g} s per size)", kTrialBudgetS),
             gloo_on   ? ", dtrain and raw Gloo trials interleaved"
             : nccl_on ? ", dtrain and raw NCCL trials interleaved"
                       : "");
  if (!o.aa)
    fmt::print("# dtrain's op: {}\n", o.async ? "submitted, then Work::wait() (--async)"
                                              : "the blocking call (CallOptions::blocking; --async: submit + wait())");
  if (o.aa)
    fmt::print(
        "# A/A run (--aa): the dtrain columns are a second raw-{} {}; their ratios to raw {} are "
        "this machine's noise\n",
        p.cuda ? "NCCL" : "Gloo", p.cuda ? "communicator" : "context", p.cuda ? "NCCL" : "Gloo");
  fmt::print(
      "# time = average per op over a trial's iterations, slowest rank, median trial; "
      "algbw = size/time; busbw = algbw x {}\n",
      p.op == Op::Allreduce   ? "2(n-1)/n"
      : p.op == Op::Allgather ? "(n-1)/n"
                              : "1");
  if (p.cuda) {
    fmt::print("# CUDA buffers: {}\n", cuda_note);
    fmt::print("# raw NCCL: {}\n",
               nccl_on ? "nccl{AllReduce,Broadcast,AllGather} called directly on an NCCL communicator of its own "
                         "(ncclCommInitRank), same device, buffers and stream; each call followed by "
                         "cudaStreamSynchronize, as dtrain's op is waited for"
                       : p.nccl_skip);
  }
  fmt::print("# raw Gloo: {}\n",
             gloo_on ? "the gloo plugin's algorithm for each size called directly on a gloo::rendezvous::Context "
                       "(TCP on lo), same buffer"
                     : p.gloo_skip);
  if (gloo_on)
    fmt::print(
        "# /gloo and dt-gloo: median over trial pairs (trial k of dtrain and of raw Gloo ran back to back) "
        "of raw time / dtrain time and of dtrain time - raw time\n");
  std::fflush(stdout);
}

// The ranks' results in the store: per size, the agreed iterations and trials
// and each implementation's trials (slowest rank) with their median.
std::vector<Row> read_rows(Store& store, const Plan& p, bool gloo_on, bool mpi_on, bool nccl_on) {
  std::vector<Row> rows;
  for (size_t i = 0; i < p.cases.size(); ++i) {
    Row r;
    r.c = p.cases[i];
    r.iters = std::stoi(store.get_string("iters/" + std::to_string(i), std::chrono::seconds(5)));
    r.trials = std::stoi(store.get_string("trials/" + std::to_string(i), std::chrono::seconds(5)));
    r.dtrain_trials = collect(store, "dtrain", i, p.world);
    if (gloo_on) r.gloo_trials = collect(store, "gloo", i, p.world);
    if (mpi_on) r.mpi_trials = collect(store, "mpi", i, p.world);
    if (nccl_on) r.nccl_trials = collect(store, "nccl", i, p.world);
    if (!r.dtrain_trials.empty()) r.dtrain = median(r.dtrain_trials);
    if (!r.gloo_trials.empty()) r.gloo = median(r.gloo_trials);
    if (!r.mpi_trials.empty()) r.mpi = median(r.mpi_trials);
    if (!r.nccl_trials.empty()) r.nccl = median(r.nccl_trials);
    rows.push_back(r);
  }
  return rows;
}

// After the ranks: one core's memcpy bandwidth in this run, and dtrain's busbw
// as a fraction of it from 256 KiB up (the sizes gradient buckets travel at).
void print_memcpy_line(const Plan& p, const std::vector<Row>& rows) {
  double mc = memcpy_gbs();
  std::string fractions;
  for (auto& r : rows)
    if (r.c.bytes >= (256u << 10) && r.dtrain)
      fractions += fmt::format("{}{} {:.2f}", fractions.empty() ? "" : ", ", human_bytes(r.c.bytes),
                               static_cast<double>(r.c.bytes) * p.busbw_factor / *r.dtrain / 1e9 / mc);
  fmt::print("# memcpy of 64 MiB on one core (the machine's ceiling for moving bytes, this run): {:.2f} GB/s{}\n", mc,
             fractions.empty() ? "" : "; dtrain busbw / memcpy: " + fractions);
}

int parent_main(const CollectivesOptions& o, const Plan& p, const std::vector<std::string>& argv) {
  install_interrupt_handlers();
  auto start = Clock::now();
  bool gloo_on = p.gloo_skip.empty();
  bool nccl_on = p.cuda && p.nccl_skip.empty();
  // --backend nccl: without a GPU, stop here, before any rank waits for a peer.
  const CudaRanks cuda = cuda_ranks(p);
  print_header(o, p, cuda.note);
  // Fail here, once, rather than in every rank.
  PluginRegistry().load(o.backend);
  std::string token = make_job_token();
  TcpStoreServer server("127.0.0.1", 0, token);
  MpiPlan mpi = plan_mpi(o, p, fmt::format("{}:{}", server.host(), server.port()));
  bool mpi_on = !mpi.mpirun.empty();
  fmt::print("# Open MPI: MPI_{}{} ({})\n",
             p.op == Op::Allreduce   ? "Allreduce"
             : p.op == Op::Broadcast ? "Bcast"
                                     : "Allgather",
             p.op == Op::Allreduce ? " in place" : "", mpi.note);
  if (mpi_on)
    fmt::print(
        "# /mpi: dtrain's busbw over Open MPI's, pooled over paired trials (geometric mean of Open MPI time / dtrain "
        "time, trial k of both back to back), with its 95% interval; > 1: dtrain faster\n");
  std::fflush(stdout);
  std::string self = self_exe();
  double busy0 = machine_busy_seconds(), own0 = own_cpu_seconds();
  std::vector<Child> kids;
  fmt::print(stderr, "dtrain-bench: running {} ranks of dtrain{}{} ...\n", p.world,
             gloo_on   ? " and raw Gloo"
             : nccl_on ? " and raw NCCL"
                       : "",
             mpi_on ? ", and Open MPI's beside them" : "");
  for (int r = 0; r < p.world; ++r) {
    std::vector<std::string> env{fmt::format("{}={}:{}:{}:{}", kWorkerEnv, r, p.world, server.host(), server.port()),
                                 fmt::format("{}={}", kTokenEnv, token)};
    env.insert(env.end(), cuda.rank_env.begin(), cuda.rank_env.end());
    if (cuda.hostid_per_rank) env.push_back(fmt::format("NCCL_HOSTID=dtrain-bench-{}-rank{}", getpid(), r));
    if (mpi_on) env.push_back(fmt::format("{}=1", kMpiPairedEnv));
    kids.push_back({spawn(self, argv, env), "rank " + std::to_string(r)});
  }
  if (mpi_on) {
    mpi.env.push_back(fmt::format("{}={}", kTokenEnv, token));
    // mpirun's stdout goes to stderr: stdout is the table.
    kids.push_back({spawn(mpi.mpirun, mpi.argv, mpi.env, 2), "mpirun (Open MPI's ranks)"});
  }
  std::string failure = wait_all(kids, std::chrono::seconds(o.time_limit_s));
  if (!failure.empty()) {
    fmt::print(stderr, "dtrain-bench: {}; the benchmark is incomplete\n", failure);
    return 1;
  }
  double t_ranks = seconds_since(start);
  // Other processes' CPU use during the timed phase: on a shared machine the
  // figures are only as good as this is small.
  double others = (machine_busy_seconds() - busy0 - (own_cpu_seconds() - own0)) / t_ranks;

  TcpStore client(server.host(), server.port(), token);
  PrefixStore store("bench", std::shared_ptr<Store>(&client, [](Store*) {}));
  std::vector<Row> rows = read_rows(store, p, gloo_on, mpi_on, nccl_on);
  if (p.cuda)
    print_nccl_table(o, p, rows);
  else
    print_table(o, p, rows, gloo_on, mpi_on);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (busy0 >= 0)
    fmt::print("# other processes used {:.2f} of the {} CPUs during the runs{}\n", std::max(others, 0.0), ncpu,
               others > 0.2 ? ": the figures are disturbed, compare ratios or rerun on a quiet machine" : "");
  if (!p.cuda) print_memcpy_line(p, rows);
  fmt::print("# wall time: {:.1f} s (every implementation, trials interleaved)\n", t_ranks);
  return 0;
}

}  // namespace
}  // namespace coll

void add_collectives_options(CLI::App* sub, CollectivesOptions& o) {
  sub->add_option("--backend", o.backend, "backend plugin to benchmark (gloo, ucx, nccl, ...)")->required();
  sub->add_option("--world-size,-n", o.world_size, "number of ranks (processes on this host)")->capture_default_str();
  sub->add_option("--op", o.op, "collective: allreduce, broadcast, allgather")->capture_default_str();
  sub->add_option("--dtype", o.dtype, "element type: f32, f64, f16, bf16, i8, u8, i32, i64")->capture_default_str();
  sub->add_option("--min-bytes,-b", o.min_bytes, "smallest size (K, M, G suffixes)")->capture_default_str();
  sub->add_option("--max-bytes,-e", o.max_bytes, "largest size")->capture_default_str();
  sub->add_option("--step-factor,-f", o.step_factor, "size multiplier between rows")->capture_default_str();
  sub->add_option("--iters", o.iters,
                  "iterations per trial: 'auto' (each implementation's from its own warm-up time) or a number")
      ->capture_default_str();
  sub->add_option("--warmup", o.warmup, "untimed iterations per size and implementation")->capture_default_str();
  sub->add_option("--trials", o.trials,
                  "timed runs per size and implementation; the median counts (0: auto, 7 to 61 to fill about 1.2 s "
                  "per size)")
      ->capture_default_str();
  sub->add_option("--target-ms", o.target_ms, "with --iters auto: wall time of one trial")->capture_default_str();
  sub->add_option("--option,-o", o.options, "backend option key=value (repeatable), e.g. algorithm=ring");
  sub->add_flag("--no-reference", o.no_reference, "run no reference (raw Gloo, Open MPI, raw NCCL)");
  sub->add_flag("--no-gloo", o.no_gloo, "leave out the raw-Gloo reference");
  sub->add_flag("--no-mpi", o.no_mpi, "leave out the Open MPI reference");
  sub->add_flag("--no-nccl", o.no_nccl, "--backend nccl: leave out the raw-NCCL reference");
  sub->add_flag("--no-dtrain", o.no_dtrain, "run the references only (to profile them alone)")->group("");
  sub->add_flag("--aa", o.aa,
                "A/A run: a second raw-Gloo instance (raw-NCCL with --backend nccl) takes dtrain's place, to show "
                "how much the ratios drift between two identical implementations on this machine");
  sub->add_flag("--no-check", o.no_check, "skip the correctness check of each size");
  sub->add_flag("--async", o.async,
                "time dtrain's ops as submit, then Work::wait() (c10d's async_op=True) instead of the blocking call "
                "(CallOptions::blocking, as MPI_Allreduce blocks)");
  sub->add_option("--mpi-transport", o.mpi_transport, "Open MPI transport: tcp or sm (default: Open MPI's choice)")
      ->check(CLI::IsMember({"", "tcp", "sm"}));
  sub->add_option("--time-limit", o.time_limit_s, "seconds before the ranks are killed")->capture_default_str();
  sub->add_flag("--verbose,-v", o.verbose, "print each size's timings as it finishes (stderr)");
}

int run_collectives(const CollectivesOptions& o, const std::vector<std::string>& argv) {
  using namespace coll;
  Plan p;
  try {
    p = make_plan(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-bench: {}\n", e.what());
    return 2;
  }
  if (const char* spec = std::getenv(kWorkerEnv)) return worker_main(o, p, spec);
  try {
    return parent_main(o, p, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-bench: {}\n", e.what());
    return 1;
  }
}

}  // namespace dtrain::bench