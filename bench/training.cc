// dtrain-bench-training: images/s of the job file's model, data-parallel
// through dtrain (Strategy + Gloo plugin) and through libtorch's own c10d
// (ProcessGroupGloo + Reducer, both from Debian's libtorch), against this
// machine's own data-parallel ceiling, in one invocation.
//
//   dtrain-bench training apps/cls.toml [--steps N] [--warmup N] [--trials N] [--backend NAME]
//                                       [-o key=value ...] [--compare key=value ...]
//   dtrain-bench training apps/cls.toml --device cuda[:N]|cpu [--python PY] [--check] [--steps N] ...
//     (dtrain-bench execs this program from its own folder)
//
// The parent runs each configuration as child processes of itself
// (--worker ...), one per rank, and prints the table. Every configuration
// trains the same model on the same fixed batch (random images of the
// dataset's shape, per rank), so only compute and communication are timed.
//
// The ceiling ("2 x 1 independent") is two single-worker trainings running at
// the same time with no gradient communication: what two workers get from
// this machine when nothing is shared. dtrain 2x1 and c10d 2x1 are judged
// against it and against each other in paired trials: each trial runs dtrain,
// c10d, the ceiling, a second dtrain (the A/A pair: the noise floor) and the
// lock-step ceiling (the ceiling plus one 4-byte all-reduce per step: what
// running in step costs before any gradient moves) back to back, in an order
// that rotates from trial to trial, and the ratios are pooled over trials
// (geometric mean, 95% interval from their spread). Each worker also reports
// where its steps go (forward, backward, the wait after it, the optimizer),
// the ranks' skew, and the CPU its training thread and its other threads used.
//
// --device cuda (or cuda:N) compares, on that GPU, dtrain's one worker with
// PyTorch eager: bench/eager_reference.py under the machine's own python and
// torch (python3 from PATH, or --python), the plain Python loop (forward,
// loss, backward, SGD step) on the same model (the parameter counts must
// agree), batch and device with no dtrain at all; and with the same loop in
// C++ on this program's libtorch (what separates dtrain's own cost from
// Python's). Paired trials, the order rotating; the job's train.bf16 and
// train.channels_last apply to all three. --device cpu runs the same rows on
// the CPU. Without a CUDA device visible to libtorch (Debian's CPU libtorch,
// no driver), or without a python that imports torch, it stops at once,
// before starting anything.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <torch/torch.h>
#include <torch/version.h>
// The c10d reference drives libtorch's C++ Reducer, whose constructor is
// internal and changes between 2.x releases: built against torch 1.x only.
#define DTRAIN_BENCH_C10D (TORCH_VERSION_MAJOR < 2)
#if DTRAIN_BENCH_C10D
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#endif

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cls/cls.h"
#include "common/device.h"
#include "common/models.h"
#include "dtrain/fleet/data_parallel.h"
#include "dtrain/communicator.h"
#include "dtrain/job.h"
#include "dtrain/sdk/strings.h"
#include "process.h"
#include "stats.h"
#include "threads.h"
#include "training_eager.h"
#include "training_result.h"

namespace {

using dtrain::bench::Clock;
using dtrain::bench::EagerPython;
using dtrain::bench::Result;
using dtrain::bench::Workload;
using namespace dtrain;

struct WorkerArgs {
  std::string job, impl = "dtrain";
  std::vector<std::string> overrides;  // -o key=value, applied to the job file
  // --compare key=value: applied on top of `overrides` to the second dtrain
  // row only, turning the A/A pair into an A/B pair (for screening a change).
  std::vector<std::string> compare;
  int rank = 0, world = 1, threads = 1, port = 0, steps = 30, warmup = 5, trials = 5;
  std::string device;              // --device: "" (the CPU rows) or cuda / cuda:N
  std::string python = "python3";  // --python: the eager reference's interpreter
  bool check = false;              // --check: stop after the model check and the header
};

Workload workload(const Config& cfg) {
  Workload w;
  w.model = cfg.get_string("model.name");
  w.width = cfg.get_float("model.width");
  if (cfg.get_string("data.dataset") == "list") {
    w.channels = static_cast<int>(cfg.get_int("data.channels"));
    w.size = static_cast<int>(cfg.get_int("data.image_size"));
    w.classes = static_cast<int>(cfg.get_int("data.num_classes"));
  }
  w.batch = cfg.get_int("train.batch_size");
  w.lr = cfg.get_float("train.lr");
  w.momentum = cfg.get_float("train.momentum");
  w.weight_decay = cfg.get_float("train.weight_decay");
  w.seed = cfg.get_int("train.seed");
  return w;
}

// The device of --device through the job's [train] keys (apps/common/device.h):
// a CUDA device libtorch cannot use is refused here, naming why.
apps::DeviceChoice bench_device(const Config& cfg, const std::string& flag) {
  return apps::choose_device(cfg, [&](const Config&, const std::string& key, const std::string& msg) {
    throw std::runtime_error("--device " + flag + ": " + key + ": " + msg +
                             "; without --device dtrain-bench training runs its CPU rows");
  });
}

// How a worker's steps synchronize: dtrain's DataParallel over the job's
// communicator, c10d's Reducer over ProcessGroupGloo, or nothing; a barrier
// around the timed steps, and (lockstep) one 4-byte all-reduce per step.
struct Sync {
  Job job;
  std::unique_ptr<dtrain::fleet::DataParallel> dp;
#if DTRAIN_BENCH_C10D
  std::unique_ptr<c10d::Reducer> reducer;
#endif
  // The c10d Reducer's calls before the forward and before the backward.
  std::function<void()> before_forward, before_backward;
  std::function<void()> barrier = [] {};
  std::function<void()> lockstep;
};

Sync connect(const WorkerArgs& a, Config& cfg, const std::shared_ptr<::torch::nn::Module>& model,
             const StrategyOptions& so) {
  Sync x;
  // "local": the ceiling. The job's communicator serves only the barriers
  // around the timed steps; the steps themselves communicate nothing.
  // "lockstep": the ceiling with one 4-byte all-reduce after each backward,
  // so the two ranks run in step as data parallelism makes them, without
  // moving any gradient.
  if (a.impl == "dtrain" || a.impl == "local" || a.impl == "lockstep") {
    setenv("RANK", std::to_string(a.rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(a.world).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(a.port).c_str(), 1);
    x.job = join_job(JobOptions::from_config(cfg), resolve_role(&cfg));
    if (a.impl == "dtrain") x.dp = std::make_unique<dtrain::fleet::DataParallel>(model, x.job.comm, so);
    x.barrier = [comm = x.job.comm] { comm->barrier()->wait(); };
    if (a.impl == "lockstep" && a.world > 1)
      x.lockstep = [comm = x.job.comm] {
        float one = 1;
        comm->allreduce(Buffer::of(&one, 1), ReduceOp::Sum)->wait();
      };
  } else if (a.impl == "eager") {
    // PyTorch eager: one process, no dtrain, no communicator.
    if (a.world != 1) throw std::runtime_error("the eager reference runs one process");
  } else {
#if DTRAIN_BENCH_C10D
    c10d::TCPStoreOptions so2;
    so2.port = static_cast<uint16_t>(a.port);
    so2.isServer = a.rank == 0;
    so2.numWorkers = a.world;
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so2);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    opts->threads = 2;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, a.rank, a.world, opts);
    std::vector<at::Tensor> params = model->parameters();
    const size_t cap = so.fuse_all_reduce_ops ? so.bucket_bytes() : 1;
    auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(params, {cap}, std::vector<bool>(params.size()));
    std::reverse(buckets.begin(), buckets.end());
    std::reverse(limits.begin(), limits.end());
    x.reducer = std::make_unique<c10d::Reducer>(params, buckets, limits, pg, std::vector<bool>(params.size(), false),
                                                static_cast<int64_t>(cap), false, false,
                                                std::unordered_map<size_t, std::string>{}, static_cast<int64_t>(cap));
    x.before_forward = [r = x.reducer.get()] { r->prepare_for_forward(); };
    x.before_backward = [r = x.reducer.get()] { r->prepare_for_backward({}); };
    x.barrier = [pg] {
      std::vector<at::Tensor> t{torch::zeros({1})};
      pg->allreduce(t)->wait();
    };
#else
    throw std::runtime_error("the c10d reference is built against torch 1.x only (this is " TORCH_VERSION ")");
#endif
  }
  return x;
}

int run_worker(const WorkerArgs& a) {
  Config cfg = apps::load_cls_config(a.job, a.overrides);
  torch::set_num_threads(a.threads);
  const Workload w = workload(cfg);
  torch::manual_seed(static_cast<uint64_t>(w.seed));
  const int64_t batch = w.batch;
  StrategyOptions so = StrategyOptions::from_config(cfg);
  auto any = apps::make_model(w.model, w.width, w.channels, w.classes);
  auto model = any.ptr();
  apps::DeviceChoice dc;
  if (!a.device.empty()) dc = bench_device(cfg, a.device);
  model->to(dc.device);
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(w.lr).momentum(w.momentum).weight_decay(w.weight_decay));
  torch::manual_seed(1000 + a.rank);
  auto images = torch::randn({batch, w.channels, w.size, w.size}).to(dc.device);
  auto labels = torch::randint(0, w.classes, {batch}, torch::kInt64).to(dc.device);
  if (dc.channels_last) images = images.contiguous(torch::MemoryFormat::ChannelsLast);
  // On a GPU the clock is read only after the device has finished the steps.
  auto device_sync = [&] {
    if (dc.cuda()) torch::cuda::synchronize(dc.device.index());
  };

  Sync sx = connect(a, cfg, model, so);
  auto& dp = sx.dp;
  auto& lockstep = sx.lockstep;

  std::vector<double> fwd, bwd, sync, optm;
  std::vector<int64_t> bwd_end;
  bool record = false;
  auto ms = [](Clock::time_point x, Clock::time_point y) {
    return std::chrono::duration<double, std::milli>(y - x).count();
  };
  auto step = [&] {
    auto t0 = Clock::now();
    if (sx.before_forward) sx.before_forward();
    if (dp) dp->begin_step(0);
    torch::Tensor loss;
    {
      apps::AutocastScope autocast(dc.bf16, dc.device);
      auto out = any.forward(images);
      loss = torch::nn::functional::cross_entropy(out, labels);
    }
    auto t1 = Clock::now();
    if (sx.before_backward) sx.before_backward();
    loss.backward();
    auto t2 = Clock::now();
    if (dp) dp->end_backward(0);
    if (lockstep) lockstep();
    auto t3 = Clock::now();
    opt.step();
    opt.zero_grad();
    auto t4 = Clock::now();
    if (!record) return;
    fwd.push_back(ms(t0, t1));
    bwd.push_back(ms(t1, t2));
    sync.push_back(ms(t2, t3));
    optm.push_back(ms(t3, t4));
    bwd_end.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t2.time_since_epoch()).count());
  };
  for (int i = 0; i < a.warmup; ++i) step();
  device_sync();
  sx.barrier();
  if (dp) dp->reset_stats();
  record = true;
  auto threads0 = bench::sample_threads();
  auto t0 = Clock::now();
  for (int i = 0; i < a.steps; ++i) step();
  device_sync();
  sx.barrier();
  double secs = bench::seconds_since(t0);
  auto threads1 = bench::sample_threads();
  double comm = dp ? dp->stats().wait_seconds : -1.0;
  std::printf("RESULT %.3f %.6f %.6f\n", double(batch) * a.world * a.steps / secs, 1e3 * secs / a.steps,
              comm < 0 ? -1.0 : 1e3 * comm / a.steps);
  std::printf("PHASES %.4f %.4f %.4f %.4f\n", bench::median(fwd), bench::median(bwd), bench::median(sync),
              bench::median(optm));
  bench::print_thread_report(threads0, threads1, static_cast<long>(gettid()), a.steps, torch::get_num_threads());
  std::printf("BWDEND");
  for (auto t : bwd_end) std::printf(" %lld", static_cast<long long>(t));
  std::printf("\n");
  std::fflush(stdout);
  return 0;
}

int free_port() { return 20000 + static_cast<int>(getpid() % 20000); }

Result run_config(const WorkerArgs& a, const std::string& impl, int world, int threads, int port,
                  const std::vector<std::string>& extra = {}) {
  std::vector<bench::Child> kids;
  std::vector<std::string> outs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = bench::worker_argv(impl, r, world, port, a.steps, a.warmup, threads);
    argv.push_back(a.job);
    if (!a.device.empty()) argv.insert(argv.end(), {"--device", a.device});
    for (const auto& o : a.overrides) argv.insert(argv.end(), {"-o", o});
    for (const auto& o : extra) argv.insert(argv.end(), {"-o", o});
    kids.push_back(bench::spawn_rank("training", r, argv, outs));
  }
  std::string failure = bench::wait_all(kids, std::chrono::seconds(600));
  std::vector<std::string> texts;
  for (auto& o : outs) {
    std::ifstream in(o);
    std::stringstream ss;
    ss << in.rdbuf();
    texts.push_back(ss.str());
  }
  for (auto& o : outs) std::remove(o.c_str());
  if (!failure.empty()) throw std::runtime_error(impl + " with " + std::to_string(world) + " workers: " + failure);
  return bench::parse_ranks(texts, impl, world);
}

struct Config2 {
  const char* name;
  const char* impl;
  int world, threads;
  std::vector<Result> runs;
  std::vector<double> ips() const {
    std::vector<double> v;
    for (auto& r : runs) v.push_back(r.ips);
    return v;
  }
};

// Paired trials: every row once per trial, the order rotating by one row each
// trial; each trial's images/s printed as "# trial N: tag ips ...".
void run_trials(int trials, const std::vector<Config2*>& rows, const std::function<Result(Config2&)>& run,
                const std::function<const char*(const Config2&)>& tag) {
  for (int t = 0; t < trials; ++t) {
    std::string line = fmt::format("# trial {}:", t + 1);
    for (size_t k = 0; k < rows.size(); ++k) {
      Config2& c = *rows[(k + size_t(t)) % rows.size()];
      c.runs.push_back(run(c));
      line += fmt::format(" {} {:.0f}", tag(c), c.runs.back().ips);
    }
    fmt::print("{}\n", line);
    std::fflush(stdout);
  }
}

std::string comm_text(const Config2& c) {
  if (c.runs.empty() || c.runs[0].comm_ms < 0) return "-";
  std::vector<double> v;
  for (auto& r : c.runs) v.push_back(r.comm_ms);
  return fmt::format("{:.1f}", bench::median(v));
}

void print_row(const Config2& c) {
  auto v = c.ips();
  std::vector<double> ms;
  for (auto& r : c.runs) ms.push_back(r.step_ms);
  std::string range = v.size() > 1 ? fmt::format("{:.0f}-{:.0f}", *std::min_element(v.begin(), v.end()),
                                                 *std::max_element(v.begin(), v.end()))
                                   : "-";
  fmt::print("{:<38} {:>10.1f} {:>13} {:>9.1f} {:>14}\n", c.name, bench::median(v), range, bench::median(ms),
             comm_text(c));
}

void print_phases(const Config2& c) {
  auto med = [&](double Result::*f) {
    std::vector<double> v;
    for (auto& r : c.runs) v.push_back(r.*f);
    return bench::median(v);
  };
  double skew = med(&Result::skew_ms);
  fmt::print("{:<38} {:>6.1f} {:>6.1f} {:>6.1f} {:>6.1f} {:>6} {:>8.1f} {:>8.2f} {:>8.2f} {:>8}\n", c.name,
             med(&Result::fwd_ms), med(&Result::bwd_ms), med(&Result::sync_ms), med(&Result::opt_ms),
             skew < 0 ? std::string("-") : fmt::format("{:.1f}", skew), med(&Result::main_cpu_ms),
             med(&Result::other_cpu_ms), med(&Result::preempt), c.runs.empty() ? 0 : c.runs[0].threads);
}

void print_ratio(const char* name, const Config2& a, const Config2& b, double target) {
  auto r = bench::pooled_ratio(a.ips(), b.ips());
  std::string verdict;
  if (target > 0) verdict = fmt::format("   [target >= {:.2f}: {}]", target, r.ratio >= target ? "met" : "NOT met");
  fmt::print("{:<38} {:>7.3f}  (95% CI {:.3f}-{:.3f}; trials {:.3f} .. {:.3f}){}\n", name, r.ratio, r.lo, r.hi, r.min,
             r.max, verdict);
}

// ---- --device: dtrain's one worker against PyTorch eager (Python) ----

// dtrain's one worker against PyTorch eager (Python) and the same loop in C++
// on the same device, model and batch, in paired trials (the order rotates).
int run_device(const WorkerArgs& a, const Config& cfg, const apps::DeviceChoice& dc) {
  const Workload w = workload(cfg);
  EagerPython py = eager_python(a.python, w, dc.device.str(), dc.bf16, dc.channels_last);
  int64_t params = 0;
  std::string shapes;  // "16x1x3x3;16;16;...", hashed as eager_reference.py's layout()
  for (const auto& p : apps::make_model(w.model, w.width, w.channels, w.classes).ptr()->parameters()) {
    params += p.numel();
    std::vector<std::string> dims;
    for (auto d : p.sizes()) dims.push_back(std::to_string(d));
    shapes += (shapes.empty() ? "" : ";") + sdk::join(dims, "x");
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : shapes) h = (h ^ ch) * 0x100000001b3ull;
  const std::string layout = fmt::format("{:016x}", h);
  if (py.probe.at("params") != std::to_string(params))
    throw std::runtime_error(
        fmt::format("the PyTorch eager reference's {} (width {:g}, {} input channels, {} classes) has {} parameters, "
                    "dtrain's (C++, "
                    "apps/common/models.cc) has {}: {} builds a different model",
                    w.model, w.width, w.channels, w.classes, py.probe.at("params"), params, py.script));
  if (py.probe["layout"] != layout)
    throw std::runtime_error(fmt::format(
        "the PyTorch eager reference's {} has dtrain's {} parameters but other shapes or another order (layout {} in "
        "Python, {} in C++, apps/common/models.cc): {} builds a different model",
        w.model, params, py.probe["layout"], layout, py.script));
  fmt::print(
      "# dtrain-bench training {} --device {}: model {} width {:g} ({} parameters in C++ and in Python), batch {} of "
      "{}x{}x{}, {} classes, SGD momentum {:g}, on {} ({}{}{}), {} timed steps (+{} warm-up), {} paired trials\n",
      a.job, a.device, w.model, w.width, params, w.batch, w.channels, w.size, w.size, w.classes, w.momentum,
      dc.device.str(), dc.source, dc.bf16 ? ", bf16 autocast" : "", dc.channels_last ? ", channels_last" : "", a.steps,
      a.warmup, a.trials);
  fmt::print(
      "# dtrain: the job joined through dtrain (backend {}) and the model wrapped in DataParallel, 1 worker, libtorch "
      "{}; PyTorch eager (Python): {} under {} (Python {}, torch {} from {}), the plain loop (forward, loss, backward, "
      "SGD step){}; libtorch eager (C++): the same loop in C++ without dtrain on this program's libtorch; each run is "
      "one process and synchronizes the device before reading the clock\n",
      cfg.get_string("job.backend"), TORCH_VERSION, py.script, py.python, py.probe["python"], py.probe["torch"],
      py.probe["torch_file"], dc.channels_last ? " with model and inputs channels_last" : "");
  if (a.check) {
    fmt::print("# --check: the PyTorch eager reference builds the same model ({} parameters); no trial run\n", params);
    return 0;
  }
  int port = free_port();
  Config2 dt{"dtrain 1 worker", "dtrain", 1, 1, {}};
  Config2 eager{"PyTorch eager (Python), 1 process", "eager-python", 1, 1, {}};
  Config2 cpp{"libtorch eager (C++), 1 process", "eager", 1, 1, {}};
  std::vector<Config2*> rows{&dt, &eager, &cpp};
  run_trials(
      a.trials, rows,
      [&](Config2& c) {
        return &c == &eager ? run_eager_python(py, a.steps, a.warmup)
                            : run_config(a, c.impl, c.world, c.threads, port++);
      },
      [&](const Config2& c) { return &c == &dt      ? "dtrain"
                                     : &c == &eager ? "eager-python"
                                                    : "eager-c++"; });
  fmt::print("{:<38} {:>10} {:>13} {:>9} {:>14}\n", "configuration", "images/s", "range", "ms/step", "comm wait ms");
  for (Config2* c : rows) print_row(*c);
  fmt::print("# paired ratios of images/s over {} trials (geometric mean)\n", a.trials);
  print_ratio("dtrain 1 worker / PyTorch eager", dt, eager, 1.0);
  print_ratio("dtrain 1 worker / libtorch eager (C++)", dt, cpp, 0);
  print_ratio("libtorch eager (C++) / PyTorch eager", cpp, eager, 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dtrain-bench-training: data-parallel training throughput, dtrain vs libtorch c10d vs this "
      "machine's ceiling"};
  WorkerArgs a;
  std::string worker;
  app.add_option("job", a.job, "job file (e.g. apps/cls.toml)")->required();
  app.add_option("--steps", a.steps, "timed steps per configuration and trial");
  app.add_option("--warmup", a.warmup, "untimed steps first");
  app.add_option("--trials", a.trials,
                 "paired trials (each runs dtrain, c10d, the ceiling, dtrain again and the lock-step ceiling)")
      ->check(CLI::Range(2, 100));
  app.add_option("-o,--override", a.overrides,
                 "key=value applied to the job file (e.g. strategy.fuse_grad_size_in_MB=1)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  std::string backend;
  app.add_option("--backend", backend,
                 "transport plugin of every row that joins a dtrain job (dtrain, the ceiling's barriers, the lock-step "
                 "all-reduce); the same as -o job.backend=NAME; default: the job file's");
  app.add_option("--compare", a.compare,
                 "key=value applied only to the second dtrain row: it becomes an A/B row instead of the A/A one")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--device", a.device,
                 "cuda or cuda:N: dtrain's one worker against PyTorch eager (Python, --python) and the same loop in "
                 "C++ on that GPU, same model and batch (cpu: the same comparison on the CPU); default: the CPU rows "
                 "(dtrain, c10d, the ceiling)");
  app.add_option("--python", a.python,
                 "with --device: the python (a name on PATH or a path) whose torch runs the PyTorch eager reference, "
                 "bench/eager_reference.py");
  app.add_flag("--check", a.check,
               "with --device: check the python, its torch and that it builds the job's model (the same parameter "
               "count), print the header and stop before any trial");
  app.add_option("--worker", worker, "(internal) run one rank: dtrain | c10d | local | lockstep | eager");
  app.add_option("--rank", a.rank, "(internal)");
  app.add_option("--world", a.world, "(internal)");
  app.add_option("--threads", a.threads, "(internal)");
  app.add_option("--port", a.port, "(internal)");
  CLI11_PARSE(app, argc, argv);
  if (!backend.empty()) a.overrides.push_back("job.backend=" + backend);
  if (!a.device.empty()) a.overrides.push_back("train.device=\"" + a.device + "\"");
  try {
    if (!worker.empty()) {
      a.impl = worker;
      return run_worker(a);
    }
    bench::install_interrupt_handlers();
    Config cfg = apps::load_cls_config(a.job, a.overrides);
    // Refused here, before any worker starts, where libtorch has no such device.
    if (!a.device.empty()) return run_device(a, cfg, bench_device(cfg, a.device));
    fmt::print(
        "# dtrain-bench training {}{}: model {} width {:g}, batch {} per worker, {} timed steps (+{} warm-up), "
        "bucket {:g} MB, {} paired trials, dtrain over {}{}\n",
        a.job, a.overrides.empty() ? "" : " -o " + fmt::format("{}", fmt::join(a.overrides, " -o ")),
        cfg.get_string("model.name"), cfg.get_float("model.width"), cfg.get_int("train.batch_size"), a.steps, a.warmup,
        cfg.get_float("strategy.fuse_grad_size_in_MB"), a.trials, cfg.get_string("job.backend"),
        a.compare.empty() ? "" : fmt::format("; A/B: the second dtrain row adds -o {}", fmt::join(a.compare, " -o ")));
    fmt::print(
        "# images/s: median over trials (range); 2-worker rows count both workers' images; comm wait: "
        "dtrain's time blocked on all-reduces after backward, per step\n");
    int port = free_port();
    Config2 one{"dtrain 1 worker x 1 thread", "dtrain", 1, 1, {}};
    Config2 two_thr{"dtrain 1 worker x 2 threads", "dtrain", 1, 2, {}};
    Config2 dt{"dtrain 2 workers x 1 thread", "dtrain", 2, 1, {}};
    Config2 c10{"c10d Reducer+Gloo 2 workers x 1 thread", "c10d", 2, 1, {}};
    Config2 ceil{"ceiling: 2 x 1 independent, no comm", "local", 2, 1, {}};
    Config2 dt2{a.compare.empty() ? "dtrain 2 workers x 1 thread (A/A #2)" : "dtrain 2 workers x 1 thread (B)",
                "dtrain",
                2,
                1,
                {}};
    Config2 lock{"lock-step: ceiling + 4 B all-reduce/step", "lockstep", 2, 1, {}};
    // Single runs for reference: what one worker gets from one and two threads.
    for (Config2* c : {&one, &two_thr}) c->runs.push_back(run_config(a, c->impl, c->world, c->threads, port++));
    std::vector<Config2*> paired{&dt, &c10, &ceil, &dt2, &lock};
    if (!DTRAIN_BENCH_C10D) {
      paired.erase(paired.begin() + 1);
      fmt::print("# no c10d row: the c10d reference is built against torch 1.x only (this is {})\n", TORCH_VERSION);
    }
    run_trials(
        a.trials, paired,
        [&](Config2& c) {
          return run_config(a, c.impl, c.world, c.threads, port++, &c == &dt2 ? a.compare : std::vector<std::string>{});
        },
        [&](const Config2& c) {
          return &c == &dt     ? "dtrain"
                 : &c == &c10  ? "c10d"
                 : &c == &ceil ? "ceiling"
                 : &c == &lock ? "lock-step"
                               : "dtrain#2";
        });
    fmt::print("{:<38} {:>10} {:>13} {:>9} {:>14}\n", "configuration", "images/s", "range", "ms/step", "comm wait ms");
    for (Config2* c : {&one, &two_thr, &ceil, &lock, &dt, &c10, &dt2})
      if (!c->runs.empty()) print_row(*c);
    fmt::print(
        "# where a step goes, ms (medians over trials of per-step medians, mean of the ranks); c10d waits for its "
        "buckets inside backward; skew: gap between the ranks' ends of backward; CPU: per step, the training "
        "thread and all other threads; preempt: the training thread's involuntary context switches per step\n");
    fmt::print("{:<38} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8}\n", "configuration", "fwd", "bwd", "sync",
               "opt", "skew", "CPU main", "CPU rest", "preempt", "threads");
    for (Config2* c : {&one, &ceil, &lock, &dt, &c10, &dt2})
      if (!c->runs.empty()) print_phases(*c);
    fmt::print("# rank 0's threads in the last trial: CPU ms per step / sleeps (voluntary switches) per step\n");
    for (Config2* c : {&ceil, &lock, &dt, &c10, &dt2})
      if (!c->runs.empty()) fmt::print("#   {:<38} {}\n", c->name, c->runs.back().rank0_threads);
    fmt::print("# paired ratios of images/s over {} trials (geometric mean)\n", a.trials);
    print_ratio("dtrain 2x1 / ceiling", dt, ceil, 0.95);
    if (!c10.runs.empty()) {
      print_ratio("dtrain 2x1 / c10d 2x1", dt, c10, 1.0);
      print_ratio("c10d 2x1 / ceiling", c10, ceil, 0);
    }
    print_ratio(a.compare.empty() ? "A/A: dtrain 2x1 / dtrain 2x1 #2" : "A/B: dtrain 2x1 / dtrain 2x1 (B)", dt, dt2, 0);
    if (!a.compare.empty()) print_ratio("dtrain 2x1 (B) / ceiling", dt2, ceil, 0);
    print_ratio("lock-step / ceiling", lock, ceil, 0);
    print_ratio("dtrain 2x1 / lock-step", dt, lock, 0);
    fmt::print("{:<38} {:>7.3f}  (median ceiling / the single 1x1 run)\n", "machine's 2-worker gain",
               bench::median(ceil.ips()) / one.runs[0].ips);
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "dtrain-bench-training: error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-bench-training: error: %s\n", e.what());
  }
  return 1;
}
