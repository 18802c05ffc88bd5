// dtrain-bench-training: images/s of the job file's model, data-parallel
// through dtrain (Strategy + Gloo plugin) and through libtorch's own c10d
// (ProcessGroupGloo + Reducer, both from Debian's libtorch), in one invocation.
//
//   dtrain-bench training apps/cls.toml [--steps N] [--warmup N]
//     (dtrain-bench execs this program from its own folder)
//
// The parent runs each configuration as child processes of itself
// (--worker ...), one per rank, and prints the table. Every configuration
// trains the same model on the same fixed batch (random images of the
// dataset's shape, per rank), so only compute and communication are timed.

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

#include "common/ddp.h"
#include "common/models.h"
#include "common/trainer.h"
#include "dtrain/communicator.h"
#include "dtrain/job.h"
#include "process.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace dtrain;

struct WorkerArgs {
  std::string job, impl = "dtrain";
  int rank = 0, world = 1, threads = 1, port = 0, steps = 60, warmup = 10;
};

struct Result {
  double ips = 0, step_ms = 0, comm_ms = 0;
};

int run_worker(const WorkerArgs& a) {
  Config cfg = apps::load_cls_config(a.job, {});
  torch::set_num_threads(a.threads);
  torch::manual_seed(static_cast<uint64_t>(cfg.get_int("train.seed", 42)));
  const int64_t batch = cfg.get_int("train.batch_size", 128);
  StrategyOptions so = StrategyOptions::from_config(cfg);
  bool list = cfg.get_string("data.dataset", "fashion-mnist") == "list";
  int channels = list ? static_cast<int>(cfg.get_int("data.channels", 3)) : 1;
  int size = list ? static_cast<int>(cfg.get_int("data.image_size", 32)) : 28;
  int classes = list ? static_cast<int>(cfg.get_int("data.num_classes", 10)) : 10;
  auto any = apps::make_model(cfg.get_string("model.name", "resnet20"), cfg.get_float("model.width", 1.0), channels,
                              classes);
  auto model = any.ptr();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(1e-4));
  torch::manual_seed(1000 + a.rank);
  auto images = torch::randn({batch, channels, size, size});
  auto labels = torch::randint(0, classes, {batch}, torch::kInt64);

  std::unique_ptr<apps::DataParallel> dp;
  Job job;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::unique_ptr<c10d::Reducer> reducer;
  std::function<void()> barrier = [] {};
  if (a.impl == "dtrain") {
    setenv("RANK", std::to_string(a.rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(a.world).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(a.port).c_str(), 1);
    job = join_job(JobOptions::from_config(cfg), resolve_role(&cfg));
    dp = std::make_unique<apps::DataParallel>(model, job.comm, so);
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

Result run_config(const std::string& job, const std::string& impl, int world, int threads, int steps, int warmup,
                  int port) {
  std::vector<bench::Child> kids;
  std::vector<std::string> outs;
  std::string exe = bench::self_exe();
  for (int r = 0; r < world; ++r) {
    std::string out = fmt::format("/tmp/dtrain-bench-training.{}.{}.out", getpid(), r);
    FILE* f = std::fopen(out.c_str(), "w");
    if (!f) throw std::runtime_error("cannot create " + out);
    std::vector<std::string> argv{exe,         "--worker",      impl,    "--rank",
                                  std::to_string(r), "--world", std::to_string(world), "--threads",
                                  std::to_string(threads), "--port", std::to_string(port), "--steps",
                                  std::to_string(steps), "--warmup", std::to_string(warmup), job};
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
  if (p == std::string::npos || std::sscanf(text.c_str() + p, "RESULT %lf %lf %lf", &r.ips, &r.step_ms, &r.comm_ms) != 3)
    throw std::runtime_error("no result from " + impl + ": " + text);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain-bench-training: data-parallel training throughput, dtrain vs libtorch c10d"};
  WorkerArgs a;
  std::string worker;
  app.add_option("job", a.job, "job file (e.g. apps/cls.toml)")->required();
  app.add_option("--steps", a.steps, "timed steps per configuration");
  app.add_option("--warmup", a.warmup, "untimed steps first");
  app.add_option("--worker", worker, "(internal) run one rank: dtrain | c10d");
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
    Config cfg = apps::load_cls_config(a.job, {});
    std::printf("# dtrain-bench training %s: model %s width %g, batch %lld per worker, %d timed steps (+%d warm-up), "
                "bucket %g MB\n",
                a.job.c_str(), cfg.get_string("model.name", "resnet20").c_str(), cfg.get_float("model.width", 1.0),
                static_cast<long long>(cfg.get_int("train.batch_size", 128)), a.steps, a.warmup,
                cfg.get_float("strategy.fuse_grad_size_in_MB", 32));
    std::printf("%-34s %10s %10s %14s %12s\n", "configuration", "images/s", "ms/step", "comm wait ms", "vs 1x1");
    int port = free_port();
    struct Row {
      const char* name;
      const char* impl;
      int world, threads;
    };
    Row rows[] = {{"dtrain 1 worker x 1 thread", "dtrain", 1, 1},
                  {"dtrain 1 worker x 2 threads", "dtrain", 1, 2},
                  {"dtrain 2 workers x 1 thread", "dtrain", 2, 1},
                  {"c10d Reducer+Gloo 2 workers x 1 thr", "c10d", 2, 1}};
    double base = 0, dt2 = 0, c10 = 0;
    for (auto& row : rows) {
      Result r = run_config(a.job, row.impl, row.world, row.threads, a.steps, a.warmup, port++);
      if (base == 0) base = r.ips;
      if (std::string(row.impl) == "dtrain" && row.world == 2) dt2 = r.ips;
      if (std::string(row.impl) == "c10d") c10 = r.ips;
      std::printf("%-34s %10.1f %10.2f %14s %11.2fx\n", row.name, r.ips, r.step_ms,
                  r.comm_ms < 0 ? "-" : fmt::format("{:.2f}", r.comm_ms).c_str(), r.ips / base);
      std::fflush(stdout);
    }
    std::printf("scaling efficiency, 2 workers: dtrain %.1f%%, c10d %.1f%%; dtrain / c10d = %.2f\n",
                100.0 * dt2 / (2 * base), 100.0 * c10 / (2 * base), dt2 / c10);
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "dtrain-bench-training: error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-bench-training: error: %s\n", e.what());
  }
  return 1;
}
