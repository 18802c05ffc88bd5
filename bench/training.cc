// dtrain-bench-training: images/s of the job file's model, data-parallel
// through dtrain (Strategy + Gloo plugin) and through libtorch's own c10d
// (ProcessGroupGloo + Reducer, both from Debian's libtorch), against this
// machine's own data-parallel ceiling, in one invocation.
//
//   dtrain-bench training apps/cls.toml [--steps N] [--warmup N] [--trials N] [-o key=value ...]
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
// c10d, the ceiling and a second dtrain (the A/A pair: the noise floor) back
// to back, in an order that rotates from trial to trial, and the ratios are
// pooled over trials (geometric mean, 95% interval from their spread).

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cls/cls.h"
#include "common/models.h"
#include "dtrain/torch/data_parallel.h"
#include "dtrain/communicator.h"
#include "dtrain/job.h"
#include "process.h"
#include "stats.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace dtrain;
// With `using namespace dtrain`, `torch` would also name dtrain::torch (the Fleet API).
namespace torch = ::torch;

struct WorkerArgs {
  std::string job, impl = "dtrain";
  std::vector<std::string> overrides;  // -o key=value, applied to the job file
  int rank = 0, world = 1, threads = 1, port = 0, steps = 30, warmup = 5, trials = 5;
};

struct Result {
  double ips = 0, step_ms = 0, comm_ms = 0;
};

int run_worker(const WorkerArgs& a) {
  Config cfg = apps::load_cls_config(a.job, a.overrides);
  torch::set_num_threads(a.threads);
  torch::manual_seed(static_cast<uint64_t>(cfg.get_int("train.seed", 42)));
  const int64_t batch = cfg.get_int("train.batch_size", 128);
  StrategyOptions so = StrategyOptions::from_config(cfg);
  bool list = cfg.get_string("data.dataset", "fashion-mnist") == "list";
  int channels = list ? static_cast<int>(cfg.get_int("data.channels", 3)) : 1;
  int size = list ? static_cast<int>(cfg.get_int("data.image_size", 32)) : 28;
  int classes = list ? static_cast<int>(cfg.get_int("data.num_classes", 10)) : 10;
  auto any =
      apps::make_model(cfg.get_string("model.name", "resnet20"), cfg.get_float("model.width", 1.0), channels, classes);
  auto model = any.ptr();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(1e-4));
  torch::manual_seed(1000 + a.rank);
  auto images = torch::randn({batch, channels, size, size});
  auto labels = torch::randint(0, classes, {batch}, torch::kInt64);

  std::unique_ptr<dtrain::torch::DataParallel> dp;
  Job job;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::unique_ptr<c10d::Reducer> reducer;
  std::function<void()> barrier = [] {};
  // "local": the ceiling. The job's communicator serves only the barriers
  // around the timed steps; the steps themselves communicate nothing.
  if (a.impl == "dtrain" || a.impl == "local") {
    setenv("RANK", std::to_string(a.rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(a.world).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(a.port).c_str(), 1);
    job = join_job(JobOptions::from_config(cfg), resolve_role(&cfg));
    if (a.impl == "dtrain") dp = std::make_unique<dtrain::torch::DataParallel>(model, job.comm, so);
    barrier = [&] { job.comm->barrier()->wait(); };
  } else {
    c10d::TCPStoreOptions so2;
    so2.port = static_cast<uint16_t>(a.port);
    so2.isServer = a.rank == 0;
    so2.numWorkers = a.world;
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so2);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    opts->threads = 2;
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, a.rank, a.world, opts);
    std::vector<at::Tensor> params = model->parameters();
    const size_t cap = so.fuse_all_reduce_ops ? so.bucket_bytes() : 1;
    auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(params, {cap}, std::vector<bool>(params.size()));
    std::reverse(buckets.begin(), buckets.end());
    std::reverse(limits.begin(), limits.end());
    reducer = std::make_unique<c10d::Reducer>(params, buckets, limits, pg, std::vector<bool>(params.size(), false),
                                              static_cast<int64_t>(cap), false, false,
                                              std::unordered_map<size_t, std::string>{}, static_cast<int64_t>(cap));
    barrier = [&] {
      std::vector<at::Tensor> t{torch::zeros({1})};
      pg->allreduce(t)->wait();
    };
  }

  auto step = [&] {
    if (reducer) reducer->prepare_for_forward();
    if (dp) dp->begin_step(0);
    auto out = any.forward(images);
    auto loss = torch::nn::functional::cross_entropy(out, labels);
    if (reducer) reducer->prepare_for_backward({});
    loss.backward();
    if (dp) dp->end_backward(0);
    opt.step();
    opt.zero_grad();
  };
  for (int i = 0; i < a.warmup; ++i) step();
  barrier();
  if (dp) dp->reset_stats();
  auto t0 = Clock::now();
  for (int i = 0; i < a.steps; ++i) step();
  barrier();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  double comm = dp ? dp->stats().wait_seconds : -1.0;
  std::printf("RESULT %.3f %.6f %.6f\n", double(batch) * a.world * a.steps / secs, 1e3 * secs / a.steps,
              comm < 0 ? -1.0 : 1e3 * comm / a.steps);
  std::fflush(stdout);
  return 0;
}

int free_port() { return 20000 + static_cast<int>(getpid() % 20000); }

Result run_config(const WorkerArgs& a, const std::string& impl, int world, int threads, int port) {
  std::vector<bench::Child> kids;
  std::vector<std::string> outs;
  std::string exe = bench::self_exe();
  for (int r = 0; r < world; ++r) {
    std::string out = fmt::format("/tmp/dtrain-bench-training.{}.{}.out", getpid(), r);
    FILE* f = std::fopen(out.c_str(), "w");
    if (!f) throw std::runtime_error("cannot create " + out);
    std::vector<std::string> argv{exe,
                                  "--worker",
                                  impl,
                                  "--rank",
                                  std::to_string(r),
                                  "--world",
                                  std::to_string(world),
                                  "--threads",
                                  std::to_string(threads),
                                  "--port",
                                  std::to_string(port),
                                  "--steps",
                                  std::to_string(a.steps),
                                  "--warmup",
                                  std::to_string(a.warmup),
                                  a.job};
    for (const auto& o : a.overrides) argv.insert(argv.end(), {"-o", o});
    kids.push_back({bench::spawn(exe, argv, {"DTRAIN_LOG_LEVEL=warn"}, fileno(f)), "rank " + std::to_string(r)});
    std::fclose(f);
    outs.push_back(out);
  }
  std::string failure = bench::wait_all(kids, std::chrono::seconds(600));
  std::string text;
  {
    std::ifstream in(outs[0]);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  for (auto& o : outs) std::remove(o.c_str());
  if (!failure.empty()) throw std::runtime_error(impl + " with " + std::to_string(world) + " workers: " + failure);
  Result r;
  size_t p = text.find("RESULT ");
  if (p == std::string::npos ||
      std::sscanf(text.c_str() + p, "RESULT %lf %lf %lf", &r.ips, &r.step_ms, &r.comm_ms) != 3)
    throw std::runtime_error("no result from " + impl + ": " + text);
  return r;
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

void print_ratio(const char* name, const Config2& a, const Config2& b, double target) {
  auto r = bench::pooled_ratio(a.ips(), b.ips());
  std::string verdict;
  if (target > 0) verdict = fmt::format("   [target >= {:.2f}: {}]", target, r.ratio >= target ? "met" : "NOT met");
  fmt::print("{:<38} {:>7.3f}  (95% CI {:.3f}-{:.3f}; trials {:.3f} .. {:.3f}){}\n", name, r.ratio, r.lo, r.hi, r.min,
             r.max, verdict);
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
  app.add_option("--trials", a.trials, "paired trials (each runs dtrain, c10d, the ceiling and dtrain again)")
      ->check(CLI::Range(2, 100));
  app.add_option("-o,--override", a.overrides,
                 "key=value applied to the job file (e.g. strategy.fuse_grad_size_in_MB=1)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--worker", worker, "(internal) run one rank: dtrain | c10d | local");
  app.add_option("--rank", a.rank, "(internal)");
  app.add_option("--world", a.world, "(internal)");
  app.add_option("--threads", a.threads, "(internal)");
  app.add_option("--port", a.port, "(internal)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!worker.empty()) {
      a.impl = worker;
      return run_worker(a);
    }
    bench::install_interrupt_handlers();
    Config cfg = apps::load_cls_config(a.job, a.overrides);
    fmt::print(
        "# dtrain-bench training {}{}: model {} width {:g}, batch {} per worker, {} timed steps (+{} warm-up), "
        "bucket {:g} MB, {} paired trials\n",
        a.job, a.overrides.empty() ? "" : " -o " + fmt::format("{}", fmt::join(a.overrides, " -o ")),
        cfg.get_string("model.name", "resnet20"), cfg.get_float("model.width", 1.0),
        cfg.get_int("train.batch_size", 128), a.steps, a.warmup, cfg.get_float("strategy.fuse_grad_size_in_MB", 32),
        a.trials);
    fmt::print(
        "# images/s: median over trials (range); 2-worker rows count both workers' images; comm wait: "
        "dtrain's time blocked on all-reduces after backward, per step\n");
    int port = free_port();
    Config2 one{"dtrain 1 worker x 1 thread", "dtrain", 1, 1, {}};
    Config2 two_thr{"dtrain 1 worker x 2 threads", "dtrain", 1, 2, {}};
    Config2 dt{"dtrain 2 workers x 1 thread", "dtrain", 2, 1, {}};
    Config2 c10{"c10d Reducer+Gloo 2 workers x 1 thread", "c10d", 2, 1, {}};
    Config2 ceil{"ceiling: 2 x 1 independent, no comm", "local", 2, 1, {}};
    Config2 dt2{"dtrain 2 workers x 1 thread (A/A #2)", "dtrain", 2, 1, {}};
    // Single runs for reference: what one worker gets from one and two threads.
    for (Config2* c : {&one, &two_thr}) c->runs.push_back(run_config(a, c->impl, c->world, c->threads, port++));
    std::vector<Config2*> paired{&dt, &c10, &ceil, &dt2};
    for (int t = 0; t < a.trials; ++t) {
      std::string line = fmt::format("# trial {}:", t + 1);
      for (size_t k = 0; k < paired.size(); ++k) {
        Config2* c = paired[(k + size_t(t)) % paired.size()];
        c->runs.push_back(run_config(a, c->impl, c->world, c->threads, port++));
        line += fmt::format(" {} {:.0f}",
                            c == &dt     ? "dtrain"
                            : c == &c10  ? "c10d"
                            : c == &ceil ? "ceiling"
                                         : "dtrain#2",
                            c->runs.back().ips);
      }
      fmt::print("{}\n", line);
      std::fflush(stdout);
    }
    fmt::print("{:<38} {:>10} {:>13} {:>9} {:>14}\n", "configuration", "images/s", "range", "ms/step", "comm wait ms");
    for (Config2* c : {&one, &two_thr, &ceil, &dt, &c10, &dt2}) print_row(*c);
    fmt::print("# paired ratios of images/s over {} trials (geometric mean)\n", a.trials);
    print_ratio("dtrain 2x1 / ceiling", dt, ceil, 0.95);
    print_ratio("dtrain 2x1 / c10d 2x1", dt, c10, 1.0);
    print_ratio("c10d 2x1 / ceiling", c10, ceil, 0);
    print_ratio("A/A: dtrain 2x1 / dtrain 2x1 #2", dt, dt2, 0);
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
