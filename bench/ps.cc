// `dtrain-bench ps`: the parent. Starts the PS servers, the raw-gRPC echo
// servers and redis-server, then the workers (every one a process), collects
// the workers' trials from the store and prints the table.
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "machine.h"
#include "process.h"
#include "ps_internal.h"
#include "stats.h"
#include "dtrain/error.h"
#include "dtrain/job_token.h"
#include "dtrain/plugin_registry.h"
#include "dtrain/store.h"

namespace dtrain::bench {

namespace psb {
namespace {

const char* kImpls[] = {"dtrain", "grpc", "redis"};

// Per trial the slowest worker (latency rows: per trial median and p99, the
// slowest worker's).
std::vector<double> collect(Store& s, size_t row, const std::string& impl, int workers, int which, int stride) {
  std::vector<double> worst;
  for (int w = 0; w < workers; ++w) {
    auto v = s.try_get(fmt::format("res/{}/{}/{}", row, impl, w));
    if (!v) return {};
    std::istringstream is(std::string(v->begin(), v->end()));
    std::vector<double> all;
    for (double x; is >> x;) all.push_back(x);
    for (size_t t = 0; t * stride + which < all.size(); ++t) {
      double x = all[t * stride + which];
      if (worst.size() <= t)
        worst.push_back(x);
      else
        worst[t] = std::max(worst[t], x);
    }
  }
  return worst;
}

std::string rate(double per_s, const char* unit) {
  if (per_s >= 1e9) return fmt::format("{:.2f} G{}", per_s / 1e9, unit);
  if (per_s >= 1e6) return fmt::format("{:.2f} M{}", per_s / 1e6, unit);
  if (per_s >= 1e3) return fmt::format("{:.1f} K{}", per_s / 1e3, unit);
  return fmt::format("{:.0f} {}", per_s, unit);
}

std::string ratio_text(const std::vector<double>& ref, const std::vector<double>& dt) {
  if (ref.empty() || dt.empty() || ref.size() != dt.size()) return "-";
  RatioCi r = pooled_ratio(ref, dt);
  return fmt::format("{:.2f} [{:.2f}-{:.2f}]", r.ratio, r.lo, r.hi);
}

void print_table(const PsBenchOptions& o, const std::vector<Row>& rows, Store& s) {
  const int W = o.workers;
  bool have[3];
  for (int j = 0; j < 3; ++j) have[j] = s.try_get(fmt::format("res/0/{}/0", kImpls[j])).has_value();
  bool any_latency = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.latency; });
  if (any_latency) {
    fmt::print("\n## per-call latency of small calls, µs: median / p99 over {} calls (median trial)\n\n",
               o.latency_calls);
    fmt::print("| call | dtrain | raw gRPC | Redis | dtrain/gRPC | dtrain/Redis |\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!rows[i].latency) continue;
      std::vector<double> p50[3], p99[3];
      std::string cell[3];
      for (int j = 0; j < 3; ++j) {
        p50[j] = collect(s, i, kImpls[j], W, 0, 2);
        p99[j] = collect(s, i, kImpls[j], W, 1, 2);
        cell[j] = p50[j].empty() ? "-" : fmt::format("{:.0f} / {:.0f}", median(p50[j]) * 1e6, median(p99[j]) * 1e6);
      }
      fmt::print("| {} | {} | {} | {} | {} | {} |\n", rows[i].label(), cell[0], cell[1], cell[2],
                 ratio_text(p50[1], p50[0]), ratio_text(p50[2], p50[0]));
    }
  }
  fmt::print(
      "\n## throughput: median trial; GB/s counts the payload both ways (keys + rows, or values); "
      "ratios are throughput ratios (reference time / dtrain time), geometric mean of the paired trials "
      "[95% interval]\n\n");
  fmt::print(
      "| call | bytes | dtrain | dtrain GB/s | raw gRPC GB/s | Redis | Redis GB/s | dtrain/gRPC | dtrain/Redis |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (r.latency) continue;
    std::vector<double> t[3];
    std::string gbs[3], items[3];
    for (int j = 0; j < 3; ++j) {
      t[j] = collect(s, i, kImpls[j], W, 0, 1);
      if (t[j].empty()) {
        gbs[j] = items[j] = "-";
        continue;
      }
      double sec = median(t[j]);
      gbs[j] = fmt::format("{:.2f}", double(r.bytes()) * W / sec / 1e9);
      items[j] = r.sparse() ? rate(double(r.keys) * W / sec, "keys/s") : rate(double(r.bytes()) * W / sec, "B/s");
    }
    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.label(), human(r.bytes(), true), items[0], gbs[0],
               gbs[1], items[2], gbs[2], ratio_text(t[1], t[0]), ratio_text(t[2], t[0]));
    if (o.verbose && !t[0].empty()) {
      // Each trial's time per call and the paired ratios (stderr, beside the table).
      std::string line = fmt::format("dtrain-bench: {}: ms per call (dtrain / gRPC / Redis):", r.label());
      for (size_t k = 0; k < t[0].size(); ++k) {
        line += fmt::format(" {:.2f}", t[0][k] * 1e3);
        for (int j = 1; j < 3; ++j)
          if (t[j].size() == t[0].size()) line += fmt::format(" / {:.2f}", t[j][k] * 1e3);
        line += ";";
      }
      fmt::print(stderr, "{}\n", line);
    }
  }
  (void)have;
}

int parent_main(const PsBenchOptions& o, const std::vector<Row>& rows, const std::vector<std::string>& argv) {
  install_interrupt_handlers();
  auto start = Clock::now();
  if (!o.no_dtrain) PluginRegistry().load(o.backend);  // fail here, once
  std::string redis_exe = o.no_redis ? "" : find_in_path("redis-server");
  std::string redis_note = o.no_redis          ? "left out (--no-redis)"
                           : redis_exe.empty() ? "left out: no redis-server on PATH"
                                               : "";
  fmt::print(
      "# dtrain-bench ps: backend '{}', {} server(s) x {} worker(s), each a process on this host; async mode, "
      "SGD tables\n",
      o.backend, o.servers, o.workers);
  fmt::print(
      "# {} trial(s) per row; a trial runs dtrain / raw gRPC / Redis interleaved in {} rounds (the order "
      "reversed every round, one untimed call first in each); calls per trial from one warm call (~{:g} ms per "
      "implementation and trial)\n",
      o.trials, kTrialRounds, o.target_ms);
  fmt::print("# raw gRPC: {}\n",
             o.no_grpc ? "left out (--no-grpc)"
                       : fmt::format("an echo service on gRPC's synchronous server (the plugin's threading), one per "
                                     "PS server; the same request and reply bytes, messages of at most {}, all "
                                     "in flight at once",
                                     human(o.chunk_bytes, true)));
  fmt::print("# Redis: {}\n", redis_note.empty() ? "one redis-server per PS server on loopback (no persistence); rows "
                                                   "as hash fields, pipelined HMGET / HSET of 512 keys per command, "
                                                   "dense as GET / SET"
                                                 : redis_note);
  if (o.pin)
    fmt::print("# pinned: server s and its gRPC echo server on allowed CPU s, worker w on allowed CPU {} + w (of {})\n",
               o.servers, std::thread::hardware_concurrency());
  std::fflush(stdout);

  std::string token = make_job_token();
  TcpStoreServer server("127.0.0.1", 0, token);
  TcpStore client(server.host(), server.port(), token);
  std::vector<std::unique_ptr<RedisServer>> redis;
  if (!redis_exe.empty())
    for (int s = 0; s < o.servers; ++s) {
      redis.push_back(std::make_unique<RedisServer>(redis_exe));
      client.set("redis/" + std::to_string(s), std::to_string(redis.back()->port()));
    }
  std::string self = self_exe();
  // --pin: server s (and its echo server) on CPU s, worker w on CPU servers + w.
  std::vector<int> cpus;  // the CPUs this process may run on (a container's cpuset, taskset)
  cpu_set_t allowed;
  if (o.pin && ::sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  auto env = [&](const std::string& role, int i) {
    std::vector<std::string> e{fmt::format("{}={}:{}:{}:{}", kRoleEnv, role, i, server.host(), server.port()),
                               fmt::format("{}={}", kTokenEnv, token)};
    if (o.pin)
      e.push_back(fmt::format("DTRAIN_BENCH_CPU={}", cpus[(role == "worker" ? o.servers + i : i) % cpus.size()]));
    return e;
  };
  std::vector<Child> servers, workers;
  for (int s = 0; s < o.servers; ++s) {
    if (!o.no_dtrain) servers.push_back({spawn(self, argv, env("server", s)), "PS server " + std::to_string(s)});
    if (!o.no_grpc) servers.push_back({spawn(self, argv, env("echo", s)), "gRPC echo server " + std::to_string(s)});
  }
  double busy0 = machine_busy_seconds();
  auto t_work = Clock::now();
  for (int w = 0; w < o.workers; ++w)
    workers.push_back({spawn(self, argv, env("worker", w)), "worker " + std::to_string(w)});
  fmt::print(stderr, "dtrain-bench: {} rows on {} worker(s) ...\n", rows.size(), o.workers);
  std::string failure = wait_all(workers, std::chrono::seconds(o.time_limit_s));
  double work_s = seconds_since(t_work);
  // The workers' processes and the servers are the bench's own: the rest of
  // the machine's busy time is what other programs took.
  double busy = machine_busy_seconds() - busy0;
  client.set("stop", std::string("done"));
  std::string sfail = wait_all(servers, std::chrono::seconds(30));
  redis.clear();
  if (!failure.empty() || !sfail.empty()) {
    fmt::print(stderr, "dtrain-bench: {}; the benchmark is incomplete\n", failure.empty() ? sfail : failure);
    return 1;
  }
  print_table(o, rows, client);
  fmt::print("\n# memcpy of 64 MiB on one core (the machine's ceiling for moving bytes): {:.2f} GB/s\n", memcpy_gbs());
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (busy >= 0)
    fmt::print(
        "# CPU busy during the timed phase: {:.2f} of {} CPUs on average (the bench's own processes "
        "included)\n",
        busy / work_s, ncpu);
  fmt::print("# wall time {:.1f} s\n", seconds_since(start));
  return 0;
}

int child_main(const PsBenchOptions& o, const std::string& spec) {
  if (const char* cpu = std::getenv("DTRAIN_BENCH_CPU")) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(std::atoi(cpu), &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0)
      throw IoError(fmt::format("cannot pin to CPU {}: {}", cpu, std::strerror(errno)));
  }
  // spec: role:index:host:port
  std::vector<std::string> f;
  std::stringstream ss(spec);
  for (std::string x; std::getline(ss, x, ':');) f.push_back(x);
  if (f.size() != 4) throw InvalidUsage("bad " + std::string(kRoleEnv) + " '" + spec + "'");
  const char* tok = std::getenv(kTokenEnv);
  std::string token = tok ? tok : "";
  int index = std::stoi(f[1]);
  auto store = std::make_shared<TcpStore>(f[2], static_cast<uint16_t>(std::stoi(f[3])), token);
  if (f[0] == "server") return server_main(o, store, index, token);
  if (f[0] == "echo") return echo_server_main(*store, index, o.chunk_bytes);
  if (f[0] == "worker") return worker_main(o, store, index, token);
  throw InvalidUsage("bad role in " + std::string(kRoleEnv) + " '" + spec + "'");
}

}  // namespace
}  // namespace psb

void add_ps_options(CLI::App* sub, PsBenchOptions& o) {
  sub->add_option("--backend", o.backend, "PS backend plugin")->capture_default_str();
  sub->add_option("--servers", o.servers, "PS servers (processes)")->capture_default_str()->check(CLI::Range(1, 64));
  sub->add_option("--workers", o.workers, "workers (processes), each making the same calls at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_option("--dims", o.dims, "sparse row dimensions")->capture_default_str();
  sub->add_option("--min-keys", o.min_keys, "fewest sparse keys per call (K, M suffixes)")->capture_default_str();
  sub->add_option("--max-keys", o.max_keys, "most sparse keys per call")->capture_default_str();
  sub->add_option("--min-bytes", o.min_bytes, "smallest dense call")->capture_default_str();
  sub->add_option("--max-bytes", o.max_bytes, "largest dense call")->capture_default_str();
  sub->add_option("--step-factor", o.step_factor, "size multiplier between rows")->capture_default_str();
  sub->add_option("--trials", o.trials, "paired trials per row (dtrain, raw gRPC, Redis back to back)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_option("--target-ms", o.target_ms, "wall time of one trial")->capture_default_str();
  sub->add_option("--latency-calls", o.latency_calls, "calls per latency trial")->capture_default_str();
  sub->add_option("--chunk-bytes", o.chunk_bytes, "largest message of the raw-gRPC reference")->capture_default_str();
  sub->add_option("--only", o.only, "run only these groups: sparse, dense, latency")
      ->check(CLI::IsMember({"sparse", "dense", "latency"}));
  sub->add_option("--ops", o.ops, "run only pulls or pushes")
      ->capture_default_str()
      ->check(CLI::IsMember({"pull", "push"}));
  sub->add_option("--option,-o", o.options, "backend option key=value (repeatable), e.g. channels=2");
  sub->add_flag("--pin", o.pin,
                "pin each server (with its gRPC echo server) and each worker to a core of its own: server s on CPU s, "
                "worker w on CPU servers + w");
  sub->add_flag("--no-grpc", o.no_grpc, "leave out the raw-gRPC reference");
  sub->add_flag("--no-redis", o.no_redis, "leave out the Redis reference");
  sub->add_flag("--no-dtrain", o.no_dtrain, "run the references only (to profile them alone)")->group("");
  sub->add_option("--time-limit", o.time_limit_s, "seconds before the workers are killed")->capture_default_str();
  sub->add_flag("--verbose,-v", o.verbose, "print each row as it finishes (stderr)");
}

int run_ps_bench(const PsBenchOptions& o, const std::vector<std::string>& argv) {
  std::vector<psb::Row> rows;
  try {
    rows = psb::make_rows(o);
    if (const char* spec = std::getenv(psb::kRoleEnv)) return psb::child_main(o, spec);
    return psb::parent_main(o, rows, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtrain-bench ps: {}\n", e.what());
    return 1;
  }
}

}  // namespace dtrain::bench
