// dtrain-bench training ctr: the CTR app (apps/ctr) on the parameter server,
// examples/s for 1 worker and for 2 workers in each PS mode (sync, async, GEO
// k_steps 10 and 100), and the time per step a worker spends in pull, compute
// and push, with the test AUC and log loss of each run.
//
//   dtrain-bench training ctr [--job apps/ctr.toml] [--lines 200000] [--batch 512] [--work DIR]
//
// Each configuration is one `dtrain --server_num 1 --worker_num W JOB` job of
// dtrain-ctr on the same generated click logs (written once into WORK/data);
// the figures are those the job's worker 0 prints: its last progress line
// (examples/s of all workers, per-step pull/compute/push) and its final
// evaluation. Run it under the build lock: the jobs use every core.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "process.h"
#include "stats.h"

namespace {

namespace fs = std::filesystem;
using dtrain::bench::Clock;
using dtrain::bench::dir_of;
using dtrain::bench::run_capture;
using dtrain::bench::seconds_since;
using dtrain::bench::self_exe;

struct Config {
  std::string name;
  int workers;
  int64_t batch_mult;  // of --batch: the 1-worker run keeps the 2-worker runs' global batch
  std::vector<std::string> overrides;
};

struct Result {
  double eps = 0, pull_ms = 0, compute_ms = 0, push_ms = 0, auc = 0, logloss = 0, train_s = 0, wall_s = 0;
  std::string failure;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result parse(const std::string& log) {
  Result r;
  static const std::regex progress(
      R"(examples/s (\d+) \(all workers\) per step: pull ([0-9.]+) ms compute ([0-9.]+) ms push ([0-9.]+) ms)");
  static const std::regex final_eval(R"(test auc ([0-9.]+) logloss ([0-9.]+) .*trained ([0-9.]+) s, (\d+) examples/s)");
  std::smatch m;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), progress); it != std::sregex_iterator(); ++it) {
    r.pull_ms = std::stod((*it)[2]);
    r.compute_ms = std::stod((*it)[3]);
    r.push_ms = std::stod((*it)[4]);
  }
  if (std::regex_search(log, m, final_eval)) {
    r.auc = std::stod(m[1]);
    r.logloss = std::stod(m[2]);
    r.train_s = std::stod(m[3]);
    r.eps = std::stod(m[4]);
  } else {
    r.failure = "no final evaluation line in worker 0's log";
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"dtrain-bench training ctr: the CTR app's examples/s per PS mode and its time per step"};
  std::string job = "apps/ctr.toml", work = "output/bench-ctr";
  int64_t lines = 200000, test_lines = 20000, batch = 512;
  std::string first;
  cli.add_option("mode", first, "ctr, or the job file (apps/ctr.toml)");
  cli.add_option("--job", job, "the CTR job file");
  cli.add_option("--lines", lines, "generated training lines (every configuration trains one epoch on them)");
  cli.add_option("--test_lines", test_lines, "generated test lines");
  cli.add_option("--batch", batch, "batch size per worker");
  cli.add_option("--work", work, "folder for the data and the jobs' logs");
  CLI11_PARSE(cli, argc, argv);
  if (first.size() > 5 && first.compare(first.size() - 5, 5, ".toml") == 0) {
    job = first;
  } else if (!first.empty() && first != "ctr") {
    std::fprintf(stderr, "dtrain-bench training ctr: unknown argument '%s'\n", first.c_str());
    return 2;
  }
  dtrain::bench::install_interrupt_handlers();

  const std::string bin = dir_of(self_exe());
  const std::string dtrain = bin + "/dtrain", ctr = bin + "/dtrain-ctr";
  for (const auto& p : {dtrain, ctr})
    if (!fs::exists(p)) {
      std::fprintf(stderr, "dtrain-bench training ctr: %s is missing (build the dtrain and dtrain-ctr targets)\n",
                   p.c_str());
      return 2;
    }
  if (!fs::exists(job)) {
    std::fprintf(stderr, "dtrain-bench training ctr: no job file '%s' (--job)\n", job.c_str());
    return 2;
  }
  fs::create_directories(work);
  work = fs::absolute(work).string();
  const std::string data = work + "/data";
  const std::string stamp = fmt::format("{}-{}", lines, test_lines);
  if (read_file(data + "/.bench-lines") != stamp) {
    auto g = run_capture(
        ctr,
        {ctr, "gen", "--dir", data, "--train_lines", std::to_string(lines), "--test_lines", std::to_string(test_lines)},
        {}, std::chrono::seconds(600));
    if (!g.failure.empty()) {
      std::fprintf(stderr, "dtrain-bench training ctr: dtrain-ctr gen failed: %s\n", g.failure.c_str());
      return 1;
    }
    std::ofstream(data + "/.bench-lines") << stamp;
  }
  const std::string teacher = read_file(data + "/teacher.toml");
  std::smatch tm;
  std::regex_search(teacher, tm, std::regex(R"(teacher_auc = ([0-9.]+))"));

  const std::vector<Config> configs = {
      {"1 worker, sync, batch 2x", 1, 2, {"strategy.a_sync=false"}},
      {"2 workers sync", 2, 1, {"strategy.a_sync=false"}},
      {"2 workers async", 2, 1, {"strategy.a_sync=true", "strategy.a_sync_configs.k_steps=0"}},
      {"2 workers GEO k_steps 10", 2, 1, {"strategy.a_sync=true", "strategy.a_sync_configs.k_steps=10"}},
      {"2 workers GEO k_steps 100", 2, 1, {"strategy.a_sync=true", "strategy.a_sync_configs.k_steps=100"}},
  };
  std::printf(
      "dtrain-bench training ctr: %s, %lld training lines (one epoch), %lld test lines, batch %lld per "
      "worker (the 1-worker run: twice that), 1 server; teacher auc %s\n",
      job.c_str(), static_cast<long long>(lines), static_cast<long long>(test_lines), static_cast<long long>(batch),
      tm.size() > 1 ? tm[1].str().c_str() : "?");
  std::printf(
      "| configuration | examples/s | pull ms/step | compute ms/step | push ms/step | test AUC | log loss | "
      "train s | wall s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::fflush(stdout);
  int failures = 0;
  for (size_t i = 0; i < configs.size(); ++i) {
    const auto& c = configs[i];
    const std::string dir = fmt::format("{}/run{}", work, i);
    fs::remove_all(dir);
    std::vector<std::string> args = {dtrain,
                                     "--server_num",
                                     "1",
                                     "--worker_num",
                                     std::to_string(c.workers),
                                     "--log_dir",
                                     dir + "/log",
                                     job,
                                     "-o",
                                     "data.dir=" + data,
                                     "-o",
                                     "data.generate=false",
                                     "-o",
                                     "train.epochs=1",
                                     "-o",
                                     "train.batch_size=" + std::to_string(batch * c.batch_mult),
                                     "-o",
                                     "checkpoint.every_steps=0",
                                     "-o",
                                     "ps.save_on_exit=false",
                                     "-o",
                                     "ps.checkpoint_dir=" + dir + "/ps"};
    for (const auto& o : c.overrides) args.insert(args.end(), {"-o", o});
    const auto t0 = Clock::now();
    auto out = run_capture(dtrain, args, {}, std::chrono::seconds(900));
    const double wall = seconds_since(t0);
    Result r = parse(read_file(dir + "/log/workerlog.0"));
    if (!out.failure.empty()) r.failure = out.failure;
    if (!r.failure.empty()) {
      ++failures;
      std::printf("| %s | failed: %s (logs in %s/log) | | | | | | | |\n", c.name.c_str(), r.failure.c_str(),
                  dir.c_str());
    } else {
      std::printf("| %s | %.0f | %.2f | %.2f | %.2f | %.4f | %.4f | %.1f | %.1f |\n", c.name.c_str(), r.eps, r.pull_ms,
                  r.compute_ms, r.push_ms, r.auc, r.logloss, r.train_s, wall);
    }
    std::fflush(stdout);
    if (dtrain::bench::interrupted()) return 1;
  }
  return failures ? 1 : 0;
}
