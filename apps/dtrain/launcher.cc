// The job on one machine: lay out the machines and processes, open the job
// store, exchange the machines' descriptions, print the table, then run
// attempts (start, monitor, stop, report) until one succeeds or restarts run out.

#include "launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/store.h"
#include "dtrain/endpoint.h"
#include "dtrain/job_token.h"
#include "environment.h"
#include "elastic.h"
#include "gpu.h"
#include "join.h"
#include "net.h"
#include "plan.h"
#include "process.h"
#include "report.h"
#include "dtrain/job_secret.h"
#include "table.h"

namespace dtrain::launch {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The monitor loop wakes on a child's output or exit, a signal, or this tick.
constexpr milliseconds kMonitorTick{100};
// How often this machine publishes its heartbeat, and looks at the store for a
// stop, the other machines' completion and their heartbeats.
constexpr milliseconds kHeartbeatInterval{500};
constexpr milliseconds kStoreCheckInterval{200};
// When only processes that lost a peer have failed, the peer that failed first
// is usually this far behind: wait for it before stopping the other machines.
constexpr milliseconds kCulpritGrace{300};
// Failure reports from other machines may still be on their way to the store.
constexpr milliseconds kRemoteReportWait{1000};
// Node 0 keeps the store up this long at most for the others to read the outcome.
constexpr std::chrono::seconds kStoreLinger{10};
constexpr milliseconds kPollInterval{100};
// The job store's root key that tells a parameter-server job's servers to stop
// (PsServer::serve() watches it); set once every worker has exited 0.
constexpr const char* kPsStopKey = "ps/stop";

volatile sig_atomic_t g_signal = 0;
int g_wake[2] = {-1, -1};

void on_signal(int sig) {
  g_signal = sig;
  (void)!write(g_wake[1], "s", 1);
}
void on_child(int) { (void)!write(g_wake[1], "c", 1); }

void install_signals() {
  if (g_wake[0] < 0) {
    if (pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) throw IoError("pipe: " + std::string(std::strerror(errno)));
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);
  sa.sa_handler = on_child;
  sa.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Orphans of the job's processes come back to dtrain, which kills them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
}

std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }

MachineOptions machine_options(const LaunchOptions& o) {
  MachineOptions m;
  m.ips = o.ips;
  m.master = o.master;
  m.nnodes = o.nnodes;
  m.node_rank = o.node_rank;
  m.start_port = o.start_port;
  return m;
}

class JobRun {
 public:
  explicit JobRun(LaunchOptions o) { p_.options = std::move(o); }
  ~JobRun() {
    std::error_code ec;
    if (!p_.error_dir.empty()) std::filesystem::remove_all(p_.error_dir, ec);
  }

  int run() {
    install_signals();
    std::string tmpl = (std::filesystem::temp_directory_path() / "dtrain-errors.XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw IoError(std::string("cannot create a temporary folder: ") + std::strerror(errno));
    p_.error_dir = tmpl;
    if (!p_.options.devices.empty()) check_devices(p_.options.devices, probe_cuda_devices());
    p_.machines = layout_machines(machine_options(p_.options));
    JobStore js = open_job_store(p_);
    server_ = std::move(js.server);
    root_ = js.root;
    store_ = js.launch;
    p_.slots = layout_processes(p_.options, p_.machines, &p_.listed);
    if (o().elastic()) return run_elastic();
    exchange_node_info(p_, *store_, [] {
      if (g_signal)
        throw InvalidUsage("interrupted by " + signal_name(g_signal) + " while waiting for the other machines");
    });
    print_job_table(p_);
    int code = 1;
    for (int attempt = 0;; ++attempt) {
      code = run_attempt(attempt);
      if (code == 0 || g_signal || attempt >= p_.options.max_restarts) break;
      if (workers_finished_) {
        std::cout << "dtrain: not restarting: every worker had finished; only the servers' stop failed\n" << std::flush;
        break;
      }
      // The new attempt's servers must not see the last one's stop.
      try {
        root_->remove(kPsStopKey);
      } catch (const std::exception&) {
      }
      std::cout << fmt::format("dtrain: restarting the job ({} of {} restarts)\n", attempt + 1, p_.options.max_restarts)
                << std::flush;
      if (!sync_nodes(fmt::format("a{}/ready", attempt + 1))) break;
    }
    finish();
    return code;
  }

 private:
  const LaunchOptions& o() const { return p_.options; }
  int node() const { return p_.machines.node; }
  int nnodes() const { return p_.machines.nnodes; }

  // ----- an elastic job: generations (elastic.h) -----
  int run_elastic() {
    const LaunchOptions& lo = o();
    p_.elastic_id = node() == 0 ? 0 : static_cast<int>(store_->add("el/next", 1));
    p_.elastic_dir = make_commit_folder(&commit_lock_);
    store_->set(fmt::format("el/info/{}", p_.elastic_id), describe_machine(p_, p_.elastic_id).encode());
    auto heartbeat = std::make_unique<ElasticHeartbeat>(connect_launch_store(p_), p_.elastic_id);
    std::unique_ptr<ElasticCoordinator> coordinator;
    if (node() == 0)
      coordinator = std::make_unique<ElasticCoordinator>(connect_launch_store(p_), lo, p_.elastic_dir + "/step");
    std::cout << fmt::format("dtrain: elastic job ({}:{} machines, store {}): this machine ({}) is member {}\n",
                             lo.nnodes_min, lo.nnodes, p_.store_endpoint, p_.machines.my_ip, p_.elastic_id)
              << std::flush;
    int code = 1;
    try {
      code = run_member(
          *store_, p_.elastic_id,
          [&](int g, std::vector<NodeInfo> nodes, int self) {
            set_machines(p_, std::move(nodes), self);
            p_.generation = g;
            elastic_members_.clear();
            for (const NodeInfo& n : p_.nodes) elastic_members_.push_back(n.node);
            print_job_table(p_);
            return run_attempt(g);
          },
          [&] { return g_signal || store_lost_; },
          [] {
            if (g_signal) throw InvalidUsage("interrupted by " + signal_name(g_signal));
          });
    } catch (const std::exception& e) {
      std::cerr << "dtrain: " << e.what() << "\n";
      code = 1;
    }
    if (node() == 0 && (code != 0 || g_signal) && !store_lost_) {
      try {  // a stop of node 0 ends the job: say why on every machine
        if (!store_->try_get("el/outcome"))
          store_->set("el/outcome",
                      fmt::format("fail\nroot cause: dtrain on node 0 ({}) {}; the job was stopped on "
                                  "every machine\n",
                                  p_.machines.my_ip, g_signal ? "received " + signal_name(g_signal) : "failed"));
      } catch (const std::exception&) {
      }
    }
    coordinator.reset();
    heartbeat.reset();
    finish();
    std::error_code ec;
    std::filesystem::remove_all(p_.elastic_dir, ec);
    close(commit_lock_);
    return g_signal ? 128 + g_signal : code;
  }

  // ----- one attempt -----
  struct Attempt {
    int number = 0;
    std::string prefix;  // store keys of this attempt: "a<n>/"
    int echo = -1;       // the process whose output is echoed to the console
    bool stopping = false, interrupted = false, done_sent = false, success = false;
    bool regroup = false;  // an elastic generation ended without a failure here
    // Parameter-server jobs: every worker of every machine has exited 0, the
    // stop key is set, and the servers have until stop_deadline to exit;
    // servers_done_sent once this machine's servers all exited 0.
    bool workers_done = false, servers_done_sent = false;
    Clock::time_point stop_deadline;
    Clock::time_point last_check, last_hb;
    std::map<int, std::pair<std::string, Clock::time_point>> peer_hb;  // node -> (value, when it changed)
    int64_t hb_count = 0;
  };

  void start_processes(Attempt& a) {
    procs_.clear();
    reported_.clear();
    for (const Slot& s : p_.slots) {
      auto proc = std::make_unique<Process>();
      std::string log = p_.log_file(s);
      std::filesystem::remove(p_.error_file(s));
      std::filesystem::remove(p_.python_error_file(s));
      if (a.number == 0)
        std::ofstream(log, std::ios::trunc);
      else
        std::ofstream(log, std::ios::app) << fmt::format("\n===== dtrain: restart {} =====\n", a.number);
      std::vector<std::string> command = o().command;
      if (o().local_rank_arg && s.role == SlotRole::Worker)
        command.push_back("--local_rank=" + std::to_string(s.local));
      proc->start(command, process_environment(p_, s, a.number), log);
      procs_.push_back(std::move(proc));
    }
    for (size_t i = 0; i < p_.slots.size(); ++i)
      if (p_.slots[i].role == SlotRole::Worker && p_.slots[i].local == 0) a.echo = static_cast<int>(i);
  }

  // Records a failure in the store for every machine's report; stop = false
  // records it without stopping the other machines yet.
  void publish(const Attempt& a, const Failure& f, bool stop = true) {
    try {
      int64_t i = store_->add(a.prefix + "nfail", 1);
      store_->set(fmt::format("{}fail/{}", a.prefix, i), f.encode());
      if (stop) store_->set(a.prefix + "stop", "1");
    } catch (const std::exception&) {
      local_failures_.push_back(f);
    }
  }

  // Reaps exited processes and publishes their failures. Returns the number of
  // workers still running; sets a.stopping on a failure.
  int collect_exits(Attempt& a, bool& only_consequences) {
    int workers_left = 0;
    for (size_t i = 0; i < procs_.size(); ++i) {
      Process& proc = *procs_[i];
      if (!proc.poll_exit()) {
        if (p_.slots[i].role == SlotRole::Worker) ++workers_left;
        continue;
      }
      if (proc.succeeded() || reported_.count(static_cast<int>(i))) continue;
      reported_.insert(static_cast<int>(i));
      Failure f = describe_exit(p_, p_.slots[i], proc, a.number, server_endpoint(a, p_.slots[i]));
      only_consequences = only_consequences && f.consequence;
      publish(a, f, !f.consequence);
      a.stopping = true;
    }
    return workers_left;
  }

  // Heartbeats, the stop key, the machines' completion. Sets a.stopping or a.success.
  void watch_store(Attempt& a, int workers_left) {
    auto now = Clock::now();
    if (workers_left == 0 && !a.done_sent) {
      store_->set(fmt::format("{}done/{}", a.prefix, node()), "1");
      a.done_sent = true;
    }
    if (now - a.last_hb > kHeartbeatInterval && !o().elastic()) {  // elastic: ElasticHeartbeat
      store_->set(fmt::format("hb/{}", node()), std::to_string(++a.hb_count));
      a.last_hb = now;
    }
    if (now - a.last_check <= kStoreCheckInterval) return;
    a.last_check = now;
    if (store_->try_get(a.prefix + "stop")) {
      a.stopping = true;
      return;
    }
    if (o().elastic() && (store_->try_get(a.prefix + "regroup") || store_->try_get("el/outcome"))) {
      a.stopping = a.regroup = true;  // the coordinator's outcome (it failed) also ends the generation
      return;
    }
    if (a.done_sent && !a.workers_done) {
      std::vector<std::string> keys;
      for (int n = 0; n < nnodes(); ++n) keys.push_back(fmt::format("{}done/{}", a.prefix, n));
      if (store_->check(keys)) {
        if (p_.server_eps.empty()) {
          a.success = true;
          return;
        }
        stop_servers(a);
      }
    }
    if (a.servers_done_sent) {
      std::vector<std::string> keys;
      for (int n = 0; n < nnodes(); ++n) keys.push_back(fmt::format("{}sdone/{}", a.prefix, n));
      if (store_->check(keys)) {
        a.success = true;
        return;
      }
    }
    for (int n = 0; n < nnodes() && !o().elastic(); ++n) {  // elastic: the coordinator watches
      if (n == node()) continue;
      auto v = store_->try_get(fmt::format("hb/{}", n));
      std::string val = v ? text(*v) : "";
      auto& seen = a.peer_hb[n];
      if (seen.first != val || seen.second.time_since_epoch().count() == 0) {
        seen = {val, now};
      } else if (now - seen.second > kPeerSilenceLimit) {
        publish(a, machine_failure(unix_ms() - std::chrono::duration_cast<milliseconds>(kPeerSilenceLimit).count(),
                                   fmt::format("dtrain on node {} ({}) stopped responding", n, p_.nodes[n].ip),
                                   fmt::format(" (no heartbeat for {} s): that machine or its dtrain died",
                                               kPeerSilenceLimit.count())));
        a.stopping = true;
        return;
      }
    }
  }

  // Every worker of the job has exited 0: tell the servers to stop.
  void stop_servers(Attempt& a) {
    a.workers_done = workers_finished_ = true;
    a.stop_deadline = Clock::now() + seconds_ms(o().server_stop_s);
    root_->set(kPsStopKey, "every worker has finished");
    const size_t n = p_.server_eps.size();
    std::cout << fmt::format("dtrain: all workers done; stopping {} server{}\n", n, n == 1 ? "" : "s") << std::flush;
  }

  // The servers of this machine after the stop key: all exited 0 (tell the
  // other machines), or the deadline passed (kill and report those left).
  void watch_server_stop(Attempt& a) {
    std::vector<size_t> left;
    for (size_t i = 0; i < procs_.size(); ++i)
      if (p_.slots[i].role == SlotRole::Server && !procs_[i]->exited()) left.push_back(i);
    if (left.empty()) {
      if (!a.servers_done_sent) {
        store_->set(fmt::format("{}sdone/{}", a.prefix, node()), "1");
        a.servers_done_sent = true;
      }
      return;
    }
    if (Clock::now() < a.stop_deadline) return;
    for (size_t i : left) {
      procs_[i]->signal(SIGKILL);
      reported_.insert(static_cast<int>(i));
      publish(a, describe_stuck_server(p_, p_.slots[i], *procs_[i], a.number, server_endpoint(a, p_.slots[i]),
                                       o().server_stop_s));
    }
    a.stopping = true;
  }

  // Where a server of this machine serves: the address its PS backend
  // published in the job store (the key the core's first "ps" communicator of
  // the attempt gives it: core/src/ps/join_ps.cc, core/src/comm/communicator.cc),
  // else the endpoint the launcher reserved for it (PADDLE_PORT).
  std::string server_endpoint(const Attempt& a, const Slot& s) {
    if (s.role != SlotRole::Server) return "";
    try {
      if (auto v = root_->try_get(fmt::format("run{}/dtrain/comm/ps.0/p/ps/server/{}", a.number, s.index)))
        return text(*v);
    } catch (const std::exception&) {
    }
    return s.endpoint;
  }

  int run_attempt(int attempt) {
    Attempt a;
    a.number = attempt;
    a.prefix = fmt::format("a{}/", attempt);
    a.last_check = a.last_hb = Clock::now() - std::chrono::seconds(1);
    workers_finished_ = false;
    start_processes(a);

    while (!a.stopping && !a.success) {
      std::vector<pollfd> fds{{g_wake[0], POLLIN, 0}};
      for (auto& proc : procs_)
        if (proc->output_fd() >= 0) fds.push_back({proc->output_fd(), POLLIN, 0});
      poll(fds.data(), fds.size(), static_cast<int>(kMonitorTick.count()));
      char sink[64];
      while (read(g_wake[0], sink, sizeof(sink)) > 0) {
      }
      drain_all(a.echo);

      if (g_signal) {
        for (auto& proc : procs_) proc->signal(g_signal);
        publish(a, machine_failure(unix_ms(),
                                   fmt::format("dtrain on node {} ({}) received {}", node(), p_.machines.my_ip,
                                               signal_name(g_signal)),
                                   "; the job was stopped on every machine"));
        a.interrupted = a.stopping = true;
        break;
      }

      bool only_consequences = true;
      int workers_left = collect_exits(a, only_consequences);
      if (a.stopping) {
        if (only_consequences) {
          // Only processes that lost a peer have failed: give the peer that
          // failed first the chance to be reported.
          auto until = Clock::now() + kCulpritGrace;
          while (only_consequences && workers_left > 0 && Clock::now() < until) {
            std::this_thread::sleep_for(milliseconds(10));
            drain_all(a.echo);
            workers_left = collect_exits(a, only_consequences);
          }
          // Held back so far, so that a culprit on another machine was not stopped first.
          try {
            store_->set(a.prefix + "stop", "1");
          } catch (const std::exception&) {
          }
        }
        break;
      }

      try {
        watch_store(a, workers_left);
        if (a.workers_done && !a.stopping && !a.success) watch_server_stop(a);
      } catch (const std::exception& e) {
        store_lost_ = true;
        local_failures_.push_back(machine_failure(
            unix_ms(), fmt::format("lost the job store at {}", p_.store_endpoint),
            fmt::format(": {}\n  the store is served by the dtrain of node 0 ({}): that machine or its dtrain died, "
                        "or this machine's network link to it is cut",
                        e.what(), o().ips.empty() ? p_.machines.store_host : o().ips[0])));
        a.stopping = true;
      }
    }

    // Parameter servers serve until every worker is done: they are stopped either way.
    stop_local(SIGTERM, a.echo);
    if (a.success || a.regroup) return 0;
    report(a);
    return g_signal ? 128 + g_signal : 1;
  }

  void drain_all(int echo) {
    for (size_t i = 0; i < procs_.size(); ++i) {
      std::string out = procs_[i]->drain();
      if (static_cast<int>(i) == echo && !out.empty()) std::cout << out << std::flush;
    }
  }

  void stop_local(int sig, int echo) {
    for (auto& proc : procs_) proc->signal(sig);
    auto deadline = Clock::now() + seconds_ms(o().grace_s);
    for (;;) {
      bool all = true;
      for (auto& proc : procs_) all = proc->poll_exit() && all;
      drain_all(echo);
      if (all) break;
      if (Clock::now() > deadline) {
        for (auto& proc : procs_) proc->signal(SIGKILL);
        deadline = Clock::now() + std::chrono::hours(1);
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    drain_all(echo);
  }

  std::vector<Failure> published_failures(const Attempt& a) {
    std::vector<Failure> out;
    try {
      auto n = store_->try_get(a.prefix + "nfail");
      int count = n ? std::atoi(text(*n).c_str()) : 0;
      for (int i = 1; i <= count; ++i)
        if (auto v = store_->try_get(fmt::format("{}fail/{}", a.prefix, i))) out.push_back(Failure::decode(text(*v)));
    } catch (const std::exception&) {
    }
    return out;
  }

  void report(const Attempt& a) {
    std::vector<Failure> all = std::move(local_failures_);
    local_failures_.clear();
    auto reports = published_failures(a);
    if (nnodes() > 1 && !a.interrupted) {
      std::this_thread::sleep_for(kRemoteReportWait);
      auto again = published_failures(a);
      if (again.size() >= reports.size()) reports = std::move(again);
    }
    all.insert(all.end(), reports.begin(), reports.end());
    if (all.empty()) return;
    order_by_root_cause(all);
    if (o().elastic() && !store_lost_ && !a.interrupted) {
      std::cout << fmt::format("dtrain: elastic generation {} stopped: {}\n", a.number, all.front().summary)
                << std::flush;
      return;
    }
    std::cerr << failure_report(all, o().grace_s) << std::flush;
  }

  bool sync_nodes(const std::string& key) {
    try {
      store_->add(key, 1);
      auto deadline = Clock::now() + seconds_ms(o().join_timeout_s);
      for (;;) {
        auto v = store_->try_get(key);
        if (v && std::atoi(text(*v).c_str()) >= nnodes()) return true;
        if (g_signal || Clock::now() > deadline) return false;
        std::this_thread::sleep_for(kPollInterval);
      }
    } catch (const std::exception& e) {
      std::cerr << "dtrain: cannot restart: " << e.what() << "\n";
      return false;
    }
  }

  void finish() {
    try {
      // An elastic job's positions change with its generations: its machines are named by their ids.
      auto exit_key = [&](int n) { return o().elastic() ? fmt::format("exit/e{}", n) : fmt::format("exit/{}", n); };
      store_->set(exit_key(o().elastic() ? p_.elastic_id : node()), "1");
      if (node() == 0 && (nnodes() > 1 || elastic_members_.size() > 1)) {
        // Keep the store up until every machine has read the outcome.
        auto deadline = Clock::now() + kStoreLinger;
        std::vector<std::string> keys;
        if (o().elastic())
          for (int id : elastic_members_) keys.push_back(exit_key(id));
        else
          for (int n = 0; n < nnodes(); ++n) keys.push_back(exit_key(n));
        while (!store_->check(keys) && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(50));
      }
    } catch (const std::exception&) {
    }
  }

  JobPlan p_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> root_;    // the job store itself (the processes' keys)
  std::shared_ptr<Store> store_;   // the launchers' keys, under "launch/"
  bool workers_finished_ = false;  // the last attempt failed after every worker finished
  bool store_lost_ = false;
  std::vector<int> elastic_members_;  // the ids of the last generation this machine ran
  int commit_lock_ = -1;              // held while this machine's commit folder is in use
  std::vector<std::unique_ptr<Process>> procs_;
  std::set<int> reported_;
  std::vector<Failure> local_failures_;
};

}  // namespace

int run_job(const LaunchOptions& options) { return JobRun(options).run(); }

}  // namespace dtrain::launch
