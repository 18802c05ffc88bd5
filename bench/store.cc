// dtrain-bench store: the launcher's join at N simulated ranks against one
// store, dtrain's TcpStoreServer against libtorch's c10d::TCPStore (1.13, the
// store before PyTorch's libuv rewrite) doing the same keys, in the same run.
//
//   dtrain-bench store --ranks 1024,4096,8192 --trials 3
//
// Every simulated rank is one connection, spread over --procs client
// processes; the join is dtrain's own publish_member/read_members (what the
// launcher runs), with the job token on. The parent also runs this program's
// server and dtrain client processes (--serve, --client); the c10d ones are
// dtrain-bench-store-c10d, next to it.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/job_token.h"
#include "dtrain/store.h"
#include "machine.h"
#include "process.h"
#include "stats.h"
#include "store_common.h"

namespace dtrain::bench::store {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kOpTimeout{std::chrono::seconds(120)};

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// ---- dtrain's server and client processes ----

int serve() {
  raise_open_files();
  TcpStoreServer server("127.0.0.1", 0, std::getenv("DTRAIN_JOB_TOKEN") ? std::getenv("DTRAIN_JOB_TOKEN") : "");
  serve_until_killed(server.port());
}

int client(const ClientArgs& a) {
  start_client(a);
  std::vector<std::shared_ptr<TcpStore>> conns;
  std::vector<std::unique_ptr<PrefixStore>> joins;
  for (int i = 0; i < a.count; ++i) {
    conns.push_back(std::make_shared<TcpStore>("127.0.0.1", static_cast<uint16_t>(a.port), a.token, kOpTimeout));
    joins.push_back(std::make_unique<PrefixStore>("join", conns.back()));
  }
  int64_t connected = now_ns();
  for (int i = 0; i < a.count; ++i) publish_member(*joins[i], a.first + i, a.world, bytes(endpoint_of(a.first + i)));
  for (int i = 0; i < a.count; ++i) {
    auto table = read_members(*joins[i], a.world, kOpTimeout);
    int probe = (a.first + i * 7919) % a.world;
    if (table[probe] != endpoint_of(probe))
      throw InvalidUsage("the table's entry " + std::to_string(probe) + " is wrong");
  }
  int64_t joined = now_ns(), exchanged = 0;
  if (a.exchange) {
    for (int i = 0; i < a.count; ++i) conns[i]->set("addr/" + std::to_string(a.first + i), endpoint_of(a.first + i));
    std::vector<std::string> keys;
    for (int r = 0; r < a.world; ++r) keys.push_back("addr/" + std::to_string(r));
    for (int i = 0; i < a.count; ++i) {
      auto all = conns[i]->multi_get(keys, kOpTimeout);
      if (all.back() != bytes(endpoint_of(a.world - 1))) throw InvalidUsage("the exchanged address is wrong");
    }
    exchanged = now_ns();
  }
  say(fmt::format("done {} {} {}", connected, joined, exchanged));
  return 0;
}

// ---- the parent ----

struct Options {
  std::vector<int> ranks{1024, 4096, 8192};
  int trials = 3;
  int procs = 16;
  int c10d_max = 4096;
  int exchange_max = 8192;
  int c10d_exchange_max = 512;
  int limit_s = 300;
};

struct Result {
  double connect_s = 0, join_s = 0, exchange_s = -1, server_mb = 0;
  std::string failure;
};

// Lines from a pipe, with a deadline.
class Lines {
 public:
  explicit Lines(int fd) : fd_(fd) {}
  // "" at end of stream or on the deadline (timed_out() says which).
  std::string next(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0 || interrupted() || ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200))) < 0) {
        if (left <= 0 || interrupted()) {
          timed_out_ = true;
          return "";
        }
        continue;
      }
      if (!p.revents) continue;
      char chunk[4096];
      ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n <= 0) return "";
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }
  bool timed_out() const { return timed_out_; }

 private:
  int fd_;
  std::string buf_;
  bool timed_out_ = false;
};

void cloexec(int fd, bool on) { ::fcntl(fd, F_SETFD, on ? FD_CLOEXEC : 0); }

Result run_once(const std::string& kind, int world, bool exchange, const Options& o) {
  const std::string exe = kind == "dtrain" ? self_exe() : dir_of(self_exe()) + "/dtrain-bench-store-c10d";
  const std::string token = kind == "dtrain" ? make_job_token() : "";
  const std::vector<std::string> env{"DTRAIN_JOB_TOKEN=" + token, "DTRAIN_LOG_LEVEL=error"};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.limit_s);
  Result r;
  std::vector<Child> kids;
  auto fail = [&](const std::string& why) {
    r.failure = why;
    for (auto& k : kids) ::kill(k.pid, SIGKILL);
    for (auto& k : kids) ::waitpid(k.pid, nullptr, 0);
    return r;
  };

  int sp[2];
  if (::pipe2(sp, O_CLOEXEC) != 0) throw IoError("pipe failed");
  kids.push_back({spawn(exe, {exe, "--serve"}, env, sp[1]), kind + " server"});
  ::close(sp[1]);
  Lines server_out(sp[0]);
  std::string first = server_out.next(deadline);
  ::close(sp[0]);
  if (first.rfind("port ", 0) != 0) return fail(kind + " server did not start");
  const std::string port = first.substr(5);
  const double rss0 = process_status_mb(std::to_string(kids[0].pid), "VmRSS");

  int out[2], go[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(go, O_CLOEXEC) != 0) throw IoError("pipe failed");
  cloexec(go[0], false);
  const int procs = std::min(o.procs, world);
  for (int p = 0; p < procs; ++p) {
    int lo = world * p / procs, hi = world * (p + 1) / procs;
    std::vector<std::string> argv{exe,       "--client",
                                  "--port",  port,
                                  "--world", std::to_string(world),
                                  "--first", std::to_string(lo),
                                  "--count", std::to_string(hi - lo),
                                  "--go-fd", std::to_string(go[0])};
    if (exchange) argv.push_back("--exchange");
    if (!token.empty()) argv.insert(argv.end(), {"--token", token});
    kids.push_back({spawn(exe, argv, env, out[1]), fmt::format("{} client {}", kind, p)});
  }
  ::close(out[1]);
  ::close(go[0]);
  Lines lines(out[0]);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } close_out{out[0]}, close_go{go[1]};
  for (int ready = 0; ready < procs;) {
    std::string l = lines.next(deadline);
    if (l == "ready")
      ++ready;
    else if (l.empty())
      return fail(lines.timed_out() ? "clients not ready in time" : "a client died before it was ready");
  }
  const int64_t t0 = now_ns();
  std::string gos(static_cast<size_t>(procs), 'g');
  if (::write(go[1], gos.data(), gos.size()) != static_cast<ssize_t>(gos.size())) return fail("go pipe");
  int64_t connected = 0, joined = 0, exchanged = 0;
  for (int done = 0; done < procs;) {
    std::string l = lines.next(deadline);
    if (l.empty())
      return fail(lines.timed_out() ? fmt::format("over the {} s limit", o.limit_s)
                                    : "a client died (its stderr says why)");
    if (l.rfind("error ", 0) == 0) return fail(l.substr(6));
    long long c = 0, j = 0, e = 0;
    if (std::sscanf(l.c_str(), "done %lld %lld %lld", &c, &j, &e) != 3) continue;
    connected = std::max<int64_t>(connected, c);
    joined = std::max<int64_t>(joined, j);
    exchanged = std::max<int64_t>(exchanged, e);
    ++done;
  }
  r.server_mb = process_status_mb(std::to_string(kids[0].pid), "VmHWM") - rss0;
  r.connect_s = double(connected - t0) / 1e9;
  r.join_s = double(joined - t0) / 1e9;
  if (exchange) r.exchange_s = double(exchanged - joined) / 1e9;
  ::kill(kids[0].pid, SIGKILL);
  for (auto& k : kids) ::waitpid(k.pid, nullptr, 0);
  return r;
}

int run_parent(const Options& o) {
  install_interrupt_handlers();
  const bool have_c10d = ::access((dir_of(self_exe()) + "/dtrain-bench-store-c10d").c_str(), X_OK) == 0;
  std::printf(
      "dtrain-bench store: the launcher's join (publish an endpoint, wait for all, read the table) at N\n"
      "simulated ranks, one connection each, over %d client processes; dtrain's store with the job token on,\n"
      "against libtorch's c10d::TCPStore%s doing the same keys. %d trial(s), paired; medians (min-max).\n\n",
      o.procs, have_c10d ? " (1.13)" : " (not built: no libtorch)", o.trials);
  std::printf(
      "| ranks | store | connect s | join s (connect included) | server memory MB | full exchange s | c10d/dtrain join "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  bool ok = true;
  for (int world : o.ranks) {
    std::vector<std::string> kinds{"dtrain"};
    if (have_c10d && world <= o.c10d_max) kinds.push_back("c10d");
    std::map<std::string, std::vector<double>> connect, join, mem, exch;
    std::vector<double> ratios;
    std::map<std::string, std::string> failures;
    for (int t = 0; t < o.trials && !interrupted(); ++t) {
      std::map<std::string, double> this_join;
      // Alternate which store goes first, so neither always runs on a warmer machine.
      auto order = kinds;
      if (t % 2) std::reverse(order.begin(), order.end());
      for (const auto& kind : order) {
        bool exchange = world <= (kind == "dtrain" ? o.exchange_max : o.c10d_exchange_max);
        Result r = run_once(kind, world, exchange, o);
        if (!r.failure.empty()) {
          failures[kind] = r.failure;
          ok = false;
          continue;
        }
        connect[kind].push_back(r.connect_s);
        join[kind].push_back(r.join_s);
        mem[kind].push_back(r.server_mb);
        if (r.exchange_s >= 0) exch[kind].push_back(r.exchange_s);
        this_join[kind] = r.join_s;
      }
      if (this_join.count("dtrain") && this_join.count("c10d"))
        ratios.push_back(this_join["c10d"] / this_join["dtrain"]);
    }
    for (const auto& kind : kinds) {
      std::string name = kind == "dtrain" ? "dtrain" : "c10d TCPStore";
      if (failures.count(kind) && join[kind].empty()) {
        std::printf("| %d | %s | failed: %s | | | | |\n", world, name.c_str(), failures[kind].c_str());
        continue;
      }
      std::string ex = exch[kind].empty() ? "not run (N x N gets)" : median_range(exch[kind], 2);
      std::string ratio = kind == "c10d" ? (ratios.empty() ? "-" : median_range(ratios, 1) + "x") : "";
      std::printf("| %d | %s | %s | %s | %s | %s | %s |\n", world, name.c_str(), median_range(connect[kind], 2).c_str(),
                  median_range(join[kind], 2).c_str(), median_range(mem[kind], 1).c_str(), ex.c_str(), ratio.c_str());
      if (failures.count(kind))
        std::printf("|   | %s | a trial failed: %s | | | | |\n", name.c_str(), failures[kind].c_str());
    }
    std::fflush(stdout);
  }
  std::printf(
      "\nserver memory: the store process's peak resident size minus its size before the clients came.\n"
      "full exchange: after the join, every rank publishes an address and reads all N (Gloo's full\n"
      "mesh); dtrain in one batched GETS per rank, c10d 1.13 (no multi-get) in N gets per rank.\n");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace dtrain::bench::store

int main(int argc, char** argv) {
  using namespace dtrain::bench::store;
  CLI::App app{"dtrain-bench store: rendezvous of thousands of ranks, dtrain's store against c10d's TCPStore"};
  Options o;
  ClientArgs c;
  bool serve_mode = false, client_mode = false;
  app.add_flag("--serve", serve_mode, "(internal) run the store's server");
  app.add_flag("--client", client_mode, "(internal) run simulated ranks");
  app.add_option("--ranks", o.ranks, "simulated ranks per run")->delimiter(',')->check(CLI::Range(2, 1 << 20));
  app.add_option("--trials", o.trials, "paired trials per size")->check(CLI::Range(1, 100));
  app.add_option("--procs", o.procs, "client processes the ranks are spread over")->check(CLI::Range(1, 256));
  app.add_option("--c10d-max", o.c10d_max, "largest size run on c10d's TCPStore (2 connections per rank)");
  app.add_option("--exchange-max", o.exchange_max, "largest size of dtrain's full-exchange row");
  app.add_option("--c10d-exchange-max", o.c10d_exchange_max, "largest size of c10d's full-exchange row (N x N gets)");
  app.add_option("--limit", o.limit_s, "seconds one run may take")->check(CLI::Range(5, 3600));
  add_client_args(app, c);
  CLI11_PARSE(app, argc, argv);
  try {
    if (serve_mode) return serve();
    if (client_mode) return client(c);
    return run_parent(o);
  } catch (const std::exception& e) {
    if (client_mode) say(std::string("error ") + e.what());
    std::fprintf(stderr, "dtrain-bench store: %s\n", e.what());
    return 1;
  }
}
