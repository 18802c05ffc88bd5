// dtrain-bench memory: what each rank holds under the large-model strategies
// (sharding stages 1-3, recompute) against plain data parallelism, on
// ResNet-50 (25.6M parameters) with Adam, at 2 and 4 workers on one machine.
//
// Every configuration runs as its own set of processes (one per rank, through
// the job's rendezvous like any dtrain job), trains a few steps on random
// images and reports, after the last step: parameter, gradient and optimizer
// state bytes it keeps (whole parameters, shards, gradient buckets), its peak
// RSS, and the median step time. The table compares each configuration with
// plain data parallelism of the same world size in the same invocation.
//
//   dtrain-bench memory                       ResNet-50, 64x64 images, batch 8, worlds 2 and 4
//   dtrain-bench memory --worlds 2 --steps 4 --image-size 32
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/models.h"
#include "dtrain/communicator.h"
#include "dtrain/config.h"
#include "dtrain/job.h"
#include "dtrain/fleet/fleet.h"
#include "process.h"
#include "stats.h"

namespace {

using namespace dtrain;
namespace tch = ::torch;

struct Options {
  std::string model = "resnet50", backend = "gloo";
  int image_size = 64, batch = 8, steps = 4, warmup = 1, threads = 1;
  std::vector<int> worlds{2, 4};
  std::vector<std::string> configs{"plain", "recompute", "stage1", "stage2", "stage3", "stage3+recompute"};
  // worker mode
  std::string worker;
  int rank = 0, world = 1, port = 0;
};

StrategyOptions strategy_of(const std::string& config) {
  StrategyOptions s;
  s.fuse_grad_size_in_MB = 25;
  if (config.rfind("stage", 0) == 0) {
    s.sharding = true;
    s.sharding_stage = config[5] - '0';
  }
  s.recompute = config.find("recompute") != std::string::npos;
  return s;
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

int run_worker(const Options& o) {
  setenv("RANK", std::to_string(o.rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(o.world).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(o.port).c_str(), 1);
  setenv("DTRAIN_BACKEND", o.backend.c_str(), 1);
  tch::set_num_threads(o.threads);
  tch::manual_seed(1);
  Config cfg;
  Job job = join_job(JobOptions::from_config(cfg), resolve_role(&cfg));
  auto any = apps::make_model(o.model, 1.0, 3, 1000);
  auto model = any.ptr();
  const StrategyOptions so = strategy_of(o.worker);
  auto dp = std::make_shared<dtrain::fleet::DataParallel>(model, job.comm, so);
  auto models = std::make_shared<dtrain::fleet::ModelSet>();
  models->add(dp);
  dtrain::fleet::DistributedOptimizer opt(
      std::make_shared<tch::optim::Adam>(model->parameters(), tch::optim::AdamOptions(1e-4)), so, models);
  model->train();
  std::vector<double> secs;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    auto x = tch::randn({o.batch, 3, o.image_size, o.image_size});
    auto y = tch::randint(0, 1000, {o.batch}, tch::kLong);
    auto t0 = std::chrono::steady_clock::now();
    auto loss = tch::cross_entropy_loss(any.forward(x), y);
    opt.scale(loss).backward();
    if (opt.step()) opt.zero_grad();
    if (s >= o.warmup) secs.push_back(bench::seconds_since(t0));
  }
  int64_t params = 0, grads = 0;
  if (auto* sp = dp->sharding()) {
    auto m = sp->memory();
    params = m.parameter_bytes;
    grads = m.gradient_bytes;
  } else {
    for (auto& p : model->parameters()) {
      params += static_cast<int64_t>(p.storage().nbytes());
      if (p.grad().defined()) grads += p.grad().numel() * static_cast<int64_t>(sizeof(float));
    }
  }
  const int64_t state = dtrain::fleet::optimizer_state_bytes(opt.inner());
  int64_t count = 0;
  for (auto& p : model->parameters()) count += p.numel();
  std::printf("RESULT %d %lld %lld %lld %lld %lld %.6f\n", o.rank, static_cast<long long>(count),
              static_cast<long long>(params), static_cast<long long>(grads), static_cast<long long>(state),
              static_cast<long long>(peak_rss_bytes()), bench::median(secs));
  std::fflush(stdout);
  job.comm->barrier(CallOptions::wait_now());
  return 0;
}

struct Row {
  int64_t count = 0, params = 0, grads = 0, state = 0, rss = 0;  // max over ranks
  double step = 0;                                               // slowest rank's median
};

Row run_config(const Options& o, const std::string& config, int world, int port) {
  std::vector<bench::Child> kids;
  std::vector<std::string> outs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = bench::worker_argv(config, r, world, port, o.steps, o.warmup, o.threads);
    argv.insert(argv.end(), {"--model", o.model, "--backend", o.backend, "--image-size", std::to_string(o.image_size),
                             "--batch", std::to_string(o.batch)});
    kids.push_back(bench::spawn_rank("memory", r, argv, outs));
  }
  const std::string failure = bench::wait_all(kids, std::chrono::seconds(900));
  Row row;
  int seen = 0;
  for (auto& path : outs) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("RESULT ", 0) != 0) continue;
      std::istringstream is(line.substr(7));
      int rank;
      Row r;
      is >> rank >> r.count >> r.params >> r.grads >> r.state >> r.rss >> r.step;
      row.count = r.count;
      row.params = std::max(row.params, r.params);
      row.grads = std::max(row.grads, r.grads);
      row.state = std::max(row.state, r.state);
      row.rss = std::max(row.rss, r.rss);
      row.step = std::max(row.step, r.step);
      ++seen;
    }
    std::remove(path.c_str());
  }
  if (!failure.empty() || seen != world)
    throw std::runtime_error(config + " at " + std::to_string(world) +
                             " workers: " + (failure.empty() ? "a rank reported nothing" : failure));
  return row;
}

double mb(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

int run_parent(const Options& o) {
  bench::install_interrupt_handlers();
  std::printf("dtrain-bench memory: %s, Adam, %dx%d images, batch %d per worker, %d steps (+%d warm-up), backend %s\n",
              o.model.c_str(), o.image_size, o.image_size, o.batch, o.steps, o.warmup, o.backend.c_str());
  std::printf("per rank, after the last step (the largest rank); p+g+o = parameters + gradients + optimizer state\n\n");
  std::printf("%5s  %-17s %10s %10s %10s %10s %8s %10s %9s %8s\n", "world", "strategy", "params MB", "grads MB",
              "optim MB", "p+g+o MB", "vs plain", "peak RSS", "step ms", "time x");
  int port = 21000 + static_cast<int>(getpid() % 20000);
  for (int world : o.worlds) {
    Row plain;
    for (const auto& c : o.configs) {
      Row r = run_config(o, c, world, port++);
      if (c == "plain") plain = r;
      const int64_t pgo = r.params + r.grads + r.state, plain_pgo = plain.params + plain.grads + plain.state;
      std::printf("%5d  %-17s %10.1f %10.1f %10.1f %10.1f %8s %9.0fM %9.1f %8s\n", world, c.c_str(), mb(r.params),
                  mb(r.grads), mb(r.state), mb(pgo),
                  plain_pgo > 0 ? fmt::format("{:.3f}", double(pgo) / double(plain_pgo)).c_str() : "-", mb(r.rss),
                  1e3 * r.step, plain.step > 0 ? fmt::format("{:.2f}", r.step / plain.step).c_str() : "-");
      std::fflush(stdout);
      if (bench::interrupted()) return 1;
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dtrain-bench memory: per-rank memory of sharding stages 1-3 and recompute against plain data "
      "parallelism"};
  Options o;
  app.add_option("--model", o.model, "an apps model (resnet50: 25.6M parameters)");
  app.add_option("--backend", o.backend, "collective backend");
  app.add_option("--image-size", o.image_size, "square input images");
  app.add_option("--batch", o.batch, "images per worker per step");
  app.add_option("--steps", o.steps, "timed steps");
  app.add_option("--warmup", o.warmup, "untimed steps first");
  app.add_option("--threads", o.threads, "intra-op threads per worker");
  app.add_option("--worlds", o.worlds, "world sizes")->delimiter(',');
  app.add_option("--configs", o.configs, "plain, recompute, stage1, stage2, stage3, stage3+recompute (comma-separated)")
      ->delimiter(',');
  app.add_option("--worker", o.worker, "(internal) run one rank of a configuration");
  app.add_option("--rank", o.rank, "(internal)");
  app.add_option("--world", o.world, "(internal)");
  app.add_option("--port", o.port, "(internal)");
  CLI11_PARSE(app, argc, argv);
  try {
    return o.worker.empty() ? run_parent(o) : run_worker(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-bench memory: %s\n", e.what());
    return 1;
  }
}
