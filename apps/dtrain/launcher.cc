#include "launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/sdk/strings.h"
#include "dtrain/store.h"
#include "net.h"
#include "process.h"

namespace dtrain::launch {

namespace {

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

using sdk::join;
using sdk::split;

std::string host_of(const std::string& endpoint) { return parse_host_port(endpoint).first; }

std::string format_time(int64_t ms) {
  time_t secs = static_cast<time_t>(ms / 1000);
  tm t{};
  localtime_r(&secs, &t);
  char buf[64];
  strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &t);
  return fmt::format("{}.{:03d}", buf, static_cast<int>(ms % 1000));
}

std::string indent(const std::string& text, const std::string& prefix) {
  std::string out;
  for (const std::string& line : split(text, '\n')) out += prefix + line + "\n";
  return out;
}

enum class SlotRole { Worker, Server };

struct Slot {
  SlotRole role = SlotRole::Worker;
  int index = 0;  // global rank (workers) or server index
  int local = 0;  // index among this machine's processes of its role
  std::string endpoint;
  std::string device;
  std::string log_name() const { return (role == SlotRole::Worker ? "workerlog." : "serverlog.") + std::to_string(index); }
  std::string name() const {
    return role == SlotRole::Worker ? "worker rank " + std::to_string(index) : "server " + std::to_string(index);
  }
};

// What each machine's dtrain tells the others through the store.
struct NodeInfo {
  int node = 0;
  std::string ip, hostname, version;
  std::vector<std::string> workers, servers;  // endpoints of its processes

  std::string encode() const {
    return fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n", node, ip, hostname, version, join(workers), join(servers));
  }
  static NodeInfo decode(const std::string& text) {
    std::vector<std::string> lines;
    std::stringstream ss(text);
    std::string line;
    while (std::getline(ss, line)) lines.push_back(line);
    lines.resize(6);
    NodeInfo n;
    n.node = std::atoi(lines[0].c_str());
    n.ip = lines[1];
    n.hostname = lines[2];
    n.version = lines[3];
    n.workers = split(lines[4]);
    n.servers = split(lines[5]);
    return n;
  }
};

struct Failure {
  int64_t time_ms = 0;
  int signal = 0;
  // The process's communicator aborted because it lost a peer (its error file
  // says so): a consequence of another failure, never chosen over one.
  bool consequence = false;
  std::string text;  // the report body
  std::string summary;

  std::string encode() const {
    return fmt::format("{}\n{}\n{}\n{}\n{}", time_ms, signal, consequence ? 1 : 0, summary, text);
  }
  static Failure decode(const std::string& s) {
    Failure f;
    std::istringstream is(s);
    std::string t, sig, cons;
    if (!std::getline(is, t) || !std::getline(is, sig) || !std::getline(is, cons) || !std::getline(is, f.summary)) {
      f.text = s;
      return f;
    }
    f.time_ms = std::atoll(t.c_str());
    f.signal = std::atoi(sig.c_str());
    f.consequence = cons == "1";
    f.text = s.substr(std::min(s.size(), static_cast<size_t>(is.tellg())));
    return f;
  }
};

class JobRun {
 public:
  explicit JobRun(LaunchOptions o) : o_(std::move(o)) {}
  ~JobRun() {
    std::error_code ec;
    if (!error_dir_.empty()) std::filesystem::remove_all(error_dir_, ec);
  }

  int run() {
    install_signals();
    std::string tmpl = (std::filesystem::temp_directory_path() / "dtrain-errors.XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw IoError(std::string("cannot create a temporary folder: ") + std::strerror(errno));
    error_dir_ = tmpl;
    layout_machines();
    open_store();
    layout_processes();
    exchange_node_info();
    print_table();
    int code = 1;
    for (int attempt = 0;; ++attempt) {
      code = run_attempt(attempt);
      if (code == 0 || g_signal || attempt >= o_.max_restarts) break;
      std::cout << fmt::format("dtrain: restarting the job ({} of {} restarts)\n", attempt + 1, o_.max_restarts)
                << std::flush;
      if (!sync_nodes(fmt::format("a{}/ready", attempt + 1))) break;
    }
    finish();
    return code;
  }

 private:
  // ----- machines and the store -----
  void layout_machines() {
    int port = o_.start_port;
    if (port == 0)
      if (const char* p = std::getenv("FLAGS_START_PORT")) port = std::atoi(p);
    if (!o_.ips.empty()) {
      nnodes_ = static_cast<int>(o_.ips.size());
      node_ = o_.node_rank;
      if (node_ < 0) {
        for (int i = 0; i < nnodes_ && node_ < 0; ++i)
          if (!local_iface_of(o_.ips[i]).empty()) node_ = i;
      }
      if (node_ < 0) {
        std::vector<std::string> mine;
        for (auto& a : local_addresses()) mine.push_back(a.ip + " (" + a.iface + ")");
        throw InvalidUsage("none of --ips " + join(o_.ips) + " is an address of this machine; its addresses are " +
                           join(mine, ", ") + " (or give --rank to say which entry this machine is)");
      }
      if (node_ >= nnodes_) throw InvalidUsage(fmt::format("--rank {} is out of range for {} --ips", node_, nnodes_));
      my_ip_ = resolve_host(o_.ips[node_]);
      store_host_ = o_.ips[0];
      store_port_ = port ? port : 6170;
    } else if (!o_.master.empty()) {
      auto [host, p] = parse_host_port(o_.master);
      nnodes_ = o_.nnodes;
      node_ = o_.node_rank < 0 ? 0 : o_.node_rank;
      if (nnodes_ > 1 && o_.node_rank < 0) throw InvalidUsage("--master with --nnodes > 1 needs --rank (this machine's index)");
      if (node_ >= nnodes_) throw InvalidUsage(fmt::format("--rank {} is out of range for --nnodes {}", node_, nnodes_));
      store_host_ = host;
      store_port_ = p;
      my_ip_ = nnodes_ > 1 ? route_ip_to(host) : "127.0.0.1";
    } else {
      if (o_.nnodes > 1) throw InvalidUsage("--nnodes > 1 needs --ips or --master to find the other machines");
      store_host_ = "127.0.0.1";
      store_port_ = port;
      my_ip_ = "127.0.0.1";
    }
    if (my_ip_.empty()) my_ip_ = "127.0.0.1";
  }

  static std::string route_ip_to(const std::string& host) {
    std::string iface = local_iface_of(host);
    if (!iface.empty()) return resolve_host(host);
    for (auto& a : local_addresses())
      if (a.iface != "lo" && a.ip.find(':') == std::string::npos) return a.ip;
    return "127.0.0.1";
  }

  void open_store() {
    token_ = std::getenv("DTRAIN_JOB_TOKEN") ? std::getenv("DTRAIN_JOB_TOKEN") : "";
    job_id_ = o_.job_id;
    if (nnodes_ == 1) {
      if (token_.empty()) token_ = make_job_token();
      if (job_id_.empty()) job_id_ = "job-" + token_.substr(0, 8);
    } else {
      // The machines share no secret channel: the token comes from the job id
      // (or DTRAIN_JOB_TOKEN), which keeps other jobs out of this store.
      if (job_id_.empty()) job_id_ = "default";
      if (token_.empty()) token_ = "dtrain-job:" + job_id_;
    }
    if (node_ == 0) {
      std::string bind = nnodes_ == 1 ? "127.0.0.1" : "0.0.0.0";
      try {
        server_ = std::make_unique<TcpStoreServer>(bind, static_cast<uint16_t>(store_port_), token_);
      } catch (const std::exception& e) {
        throw IoError(fmt::format("cannot serve the job store on {}:{}: {} (another job on this port? choose one "
                                  "with --start_port)",
                                  bind, store_port_, e.what()));
      }
      store_port_ = server_->port();
    }
    store_endpoint_ = fmt::format("{}:{}", store_host_, store_port_);
    auto client = std::make_shared<TcpStore>(store_host_, static_cast<uint16_t>(store_port_), token_,
                                             std::chrono::milliseconds(static_cast<int64_t>(o_.join_timeout_s * 1000)));
    store_ = std::make_shared<PrefixStore>("launch", client);
  }

  // ----- processes -----
  bool ps_mode() const {
    return o_.server_num > 0 || o_.worker_num > 0 || !o_.servers.empty() || !o_.workers.empty();
  }

  void layout_processes() {
    if (ps_mode()) {
      if (!o_.servers.empty() || !o_.workers.empty()) {
        add_listed(SlotRole::Server, o_.servers);
        add_listed(SlotRole::Worker, o_.workers);
      } else {
        for (int i = 0; i < o_.server_num; ++i) add_local(SlotRole::Server, "");
        for (int i = 0; i < std::max(o_.worker_num, 1); ++i) add_local(SlotRole::Worker, "");
      }
    } else if (!o_.devices.empty()) {
      for (const std::string& d : o_.devices) add_local(SlotRole::Worker, d);
    } else {
      if (o_.nproc_per_node < 1) throw InvalidUsage("--nproc_per_node must be at least 1");
      for (int i = 0; i < o_.nproc_per_node; ++i) add_local(SlotRole::Worker, "");
    }
  }

  void add_local(SlotRole role, const std::string& device) {
    Slot s;
    s.role = role;
    s.device = device;
    s.local = static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [&](const Slot& x) { return x.role == role; }));
    s.endpoint = fmt::format("{}:{}", my_ip_, pick_free_port(my_ip_));
    slots_.push_back(s);
  }

  void add_listed(SlotRole role, const std::vector<std::string>& list) {
    for (size_t i = 0; i < list.size(); ++i) {
      std::string host = host_of(list[i]);
      if (local_iface_of(host).empty()) continue;
      if (nnodes_ > 1 && resolve_host(host) != my_ip_) continue;
      Slot s;
      s.role = role;
      s.index = static_cast<int>(i);
      s.local = static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [&](const Slot& x) { return x.role == role; }));
      s.endpoint = list[i];
      slots_.push_back(s);
    }
    listed_ = true;
  }

  void exchange_node_info() {
    NodeInfo me;
    me.node = node_;
    me.ip = my_ip_;
    me.hostname = this_hostname();
    me.version = core_version();
    for (const Slot& s : slots_) (s.role == SlotRole::Worker ? me.workers : me.servers).push_back(s.endpoint);
    store_->set(fmt::format("node/{}", node_), me.encode());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.join_timeout_s * 1000));
    nodes_.resize(nnodes_);
    for (int n = 0; n < nnodes_; ++n) {
      for (;;) {
        if (g_signal) throw InvalidUsage("interrupted by " + signal_name(g_signal) + " while waiting for the other machines");
        auto v = store_->try_get(fmt::format("node/{}", n));
        if (v) {
          nodes_[n] = NodeInfo::decode(std::string(v->begin(), v->end()));
          break;
        }
        if (std::chrono::steady_clock::now() > deadline)
          throw TimeoutError(fmt::format("machine {} of {} ({}) has not joined the job after {} s; start the same "
                                         "dtrain command there, or check `dtrain check`",
                                         n, nnodes_, o_.ips.size() > static_cast<size_t>(n) ? o_.ips[n] : "?",
                                         o_.join_timeout_s));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (nodes_[n].version != me.version)
        throw InvalidUsage(fmt::format("machine {} ({}) runs dtrain {} but this one runs {}: install the same "
                                       "version everywhere",
                                       n, nodes_[n].ip, nodes_[n].version, me.version));
    }
    if (listed_) {
      worker_eps_ = o_.workers;
      server_eps_ = o_.servers;
    } else {
      for (auto& n : nodes_) {
        int base_w = static_cast<int>(worker_eps_.size()), base_s = static_cast<int>(server_eps_.size());
        if (n.node == node_) {
          for (Slot& s : slots_) s.index = (s.role == SlotRole::Worker ? base_w : base_s) + s.local;
        }
        worker_eps_.insert(worker_eps_.end(), n.workers.begin(), n.workers.end());
        server_eps_.insert(server_eps_.end(), n.servers.begin(), n.servers.end());
      }
    }
    if (worker_eps_.empty()) throw InvalidUsage("the job has no worker process");
  }

  // Where the core writes a process's first communicator abort (see DTRAIN_ERROR_FILE).
  std::string error_file(const Slot& s) const { return error_dir_ + "/" + s.log_name(); }

  std::map<std::string, std::string> env_for(const Slot& s, int attempt) const {
    int local_same = static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [&](const Slot& x) { return x.role == s.role; }));
    std::map<std::string, std::string> env = {
        {"DTRAIN_ROLE", s.role == SlotRole::Worker ? "worker" : "server"},
        {"DTRAIN_WORLD_SIZE", std::to_string(worker_eps_.size())},
        {"DTRAIN_LOCAL_RANK", std::to_string(s.local)},
        {"DTRAIN_LOCAL_WORLD_SIZE", std::to_string(local_same)},
        {"DTRAIN_NODE_RANK", std::to_string(node_)},
        {"DTRAIN_NNODES", std::to_string(nnodes_)},
        {"DTRAIN_STORE", store_endpoint_},
        {"DTRAIN_JOB_TOKEN", token_},
        {"DTRAIN_JOB_ID", job_id_},
        {"DTRAIN_RESTART_COUNT", std::to_string(attempt)},
        {"DTRAIN_WORKER_ENDPOINTS", join(worker_eps_)},
        {"DTRAIN_CURRENT_ENDPOINT", s.endpoint},
        {"DTRAIN_HOST_IP", my_ip_},
        {"DTRAIN_LOG_DIR", o_.log_dir},
        {"DTRAIN_ERROR_FILE", error_file(s)},
        {"PADDLE_TRAINERS_NUM", std::to_string(worker_eps_.size())},
        {"PADDLE_TRAINER_ENDPOINTS", join(worker_eps_)},
        {"PADDLE_CURRENT_ENDPOINT", s.endpoint},
        {"PADDLE_RANK_IN_NODE", std::to_string(s.local)},
        {"POD_IP", my_ip_},
        {"TRAINING_ROLE", s.role == SlotRole::Worker ? "TRAINER" : "PSERVER"},
    };
    if (!server_eps_.empty()) {
      env["DTRAIN_SERVER_ENDPOINTS"] = join(server_eps_);
      env["PADDLE_PSERVERS_IP_PORT_LIST"] = join(server_eps_);
    }
    if (s.role == SlotRole::Worker) {
      env["DTRAIN_RANK"] = std::to_string(s.index);
      env["PADDLE_TRAINER_ID"] = std::to_string(s.index);
    } else {
      env["DTRAIN_SERVER_INDEX"] = std::to_string(s.index);
      env["PADDLE_PORT"] = std::to_string(parse_host_port(s.endpoint).second);
    }
    if (!o_.backend.empty()) env["DTRAIN_BACKEND"] = o_.backend;
    if (!o_.log_level.empty()) env["DTRAIN_LOG_LEVEL"] = o_.log_level;
    if (!s.device.empty()) {
      env["DTRAIN_DEVICE"] = s.device;
      env["FLAGS_selected_gpus"] = s.device;
    }
    return env;
  }

  void print_table() {
    std::error_code ec;
    std::filesystem::create_directories(o_.log_dir, ec);
    if (ec) throw IoError("cannot create the log folder " + o_.log_dir + ": " + ec.message());
    std::ostringstream t;
    t << "----------------------- dtrain: distributed job -----------------------\n";
    auto row = [&](const std::string& k, const std::string& v) { t << fmt::format("  {:<16} {}\n", k, v); };
    row("mode", ps_mode() ? "parameter server" : "collective");
    if (!o_.backend.empty()) row("backend", o_.backend);
    row("job_id", job_id_);
    row("machines", fmt::format("{} (this is node {}, {})", nnodes_, node_, my_ip_));
    row("workers", std::to_string(worker_eps_.size()));
    if (!server_eps_.empty()) row("servers", std::to_string(server_eps_.size()));
    row("store", store_endpoint_ + (node_ == 0 ? " (served here)" : ""));
    row("log_dir", o_.log_dir);
    row("max_restarts", std::to_string(o_.max_restarts));
    row("command", join(o_.command, " "));
    t << fmt::format("  {:<8} {:<6} {:<5} {:<6} {:<22} {}\n", "role", "rank", "node", "local", "endpoint", "log");
    for (const Slot& s : slots_)
      t << fmt::format("  {:<8} {:<6} {:<5} {:<6} {:<22} {}\n", s.role == SlotRole::Worker ? "worker" : "server",
                       s.index, node_, s.local, s.endpoint, o_.log_dir + "/" + s.log_name());
    t << "-----------------------------------------------------------------------\n";
    std::cout << t.str() << std::flush;

    std::ofstream ep(o_.log_dir + "/endpoints.log", std::ios::trunc);
    ep << "job_id: " << job_id_ << "\nstore: " << store_endpoint_ << "\n";
    ep << "PADDLE_TRAINER_ENDPOINTS:\n";
    for (auto& e : worker_eps_) ep << e << "\n";
    if (!server_eps_.empty()) {
      ep << "PADDLE_PSERVERS_IP_PORT_LIST:\n";
      for (auto& e : server_eps_) ep << e << "\n";
    }
  }

  // ----- one attempt -----
  int run_attempt(int attempt) {
    const std::string a = fmt::format("a{}/", attempt);
    procs_.clear();
    reported_.clear();
    for (const Slot& s : slots_) {
      auto p = std::make_unique<Process>();
      std::string log = o_.log_dir + "/" + s.log_name();
      std::filesystem::remove(error_file(s));
      if (attempt == 0) std::ofstream(log, std::ios::trunc);
      else std::ofstream(log, std::ios::app) << fmt::format("\n===== dtrain: restart {} =====\n", attempt);
      p->start(o_.command, env_for(s, attempt), log);
      procs_.push_back(std::move(p));
    }
    int echo = -1;
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].role == SlotRole::Worker && slots_[i].local == 0) echo = static_cast<int>(i);

    bool stopping = false, done_sent = false, success = false;
    std::string stop_reason;
    auto last_check = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    auto last_hb = last_check;
    std::map<int, std::pair<std::string, std::chrono::steady_clock::time_point>> peer_hb;
    int64_t hb_count = 0;

    // stop = false records the failure without stopping the other machines yet.
    auto publish = [&](Failure f, bool stop = true) {
      try {
        int64_t i = store_->add(a + "nfail", 1);
        store_->set(fmt::format("{}fail/{}", a, i), f.encode());
        if (stop) store_->set(a + "stop", "1");
      } catch (const std::exception&) {
        local_failures_.push_back(f);
      }
    };

    while (!stopping) {
      std::vector<pollfd> fds{{g_wake[0], POLLIN, 0}};
      for (auto& p : procs_)
        if (p->output_fd() >= 0) fds.push_back({p->output_fd(), POLLIN, 0});
      poll(fds.data(), fds.size(), 100);
      char sink[64];
      while (read(g_wake[0], sink, sizeof(sink)) > 0) {
      }
      drain_all(echo);

      if (g_signal) {
        Failure f;
        f.time_ms = unix_ms();
        f.summary = fmt::format("dtrain on node {} ({}) received {}", node_, my_ip_, signal_name(g_signal));
        f.text = "root cause: " + f.summary + "; the job was stopped on every machine\n";
        for (auto& p : procs_) p->signal(g_signal);
        publish(f);
        stop_reason = "interrupted";
        break;
      }

      int workers_left = 0;
      bool only_consequences = true;
      auto collect_exits = [&]() {
        workers_left = 0;
        for (size_t i = 0; i < procs_.size(); ++i) {
          Process& p = *procs_[i];
          if (!p.poll_exit()) {
            if (slots_[i].role == SlotRole::Worker) ++workers_left;
            continue;
          }
          if (p.succeeded() || reported_.count(static_cast<int>(i))) continue;
          reported_.insert(static_cast<int>(i));
          Failure f = describe_failure(slots_[i], p, attempt);
          only_consequences = only_consequences && f.consequence;
          publish(f, !f.consequence);
          stopping = true;
        }
      };
      collect_exits();
      if (stopping && only_consequences) {
        // Only processes that lost a peer have failed: the peer that failed
        // first is usually a moment behind; give it the chance to be reported.
        auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
        while (only_consequences && workers_left > 0 && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          drain_all(echo);
          collect_exits();
        }
        // Held back so far, so that a culprit on another machine was not stopped first.
        try {
          store_->set(a + "stop", "1");
        } catch (const std::exception&) {
        }
      }
      if (stopping) break;

      auto now = std::chrono::steady_clock::now();
      try {
        if (workers_left == 0 && !done_sent) {
          store_->set(fmt::format("{}done/{}", a, node_), "1");
          done_sent = true;
        }
        if (now - last_hb > std::chrono::milliseconds(500)) {
          store_->set(fmt::format("hb/{}", node_), std::to_string(++hb_count));
          last_hb = now;
        }
        if (now - last_check > std::chrono::milliseconds(200)) {
          last_check = now;
          if (store_->try_get(a + "stop")) {
            stopping = true;
            break;
          }
          if (done_sent) {
            std::vector<std::string> keys;
            for (int n = 0; n < nnodes_; ++n) keys.push_back(fmt::format("{}done/{}", a, n));
            if (store_->check(keys)) {
              success = true;
              break;
            }
          }
          for (int n = 0; n < nnodes_; ++n) {
            if (n == node_) continue;
            auto v = store_->try_get(fmt::format("hb/{}", n));
            std::string val = v ? std::string(v->begin(), v->end()) : "";
            auto& seen = peer_hb[n];
            if (seen.first != val || seen.second.time_since_epoch().count() == 0) seen = {val, now};
            else if (now - seen.second > std::chrono::seconds(15)) {
              Failure f;
              f.time_ms = unix_ms() - 15000;
              f.summary = fmt::format("dtrain on node {} ({}) stopped responding", n, nodes_[n].ip);
              f.text = "root cause: " + f.summary + " (no heartbeat for 15 s): that machine or its dtrain died\n";
              publish(f);
              stopping = true;
              break;
            }
          }
        }
      } catch (const std::exception& e) {
        Failure f;
        f.time_ms = unix_ms();
        f.summary = fmt::format("lost the job store at {}", store_endpoint_);
        f.text = fmt::format("root cause: {}: {}\n  the store is served by the dtrain of node 0 ({}); that machine or its dtrain "
                             "has probably died\n",
                             f.summary, e.what(), o_.ips.empty() ? store_host_ : o_.ips[0]);
        local_failures_.push_back(f);
        stopping = true;
      }
    }

    if (success) {
      // Parameter servers serve until every worker is done.
      stop_local(SIGTERM, echo);
      return 0;
    }
    stop_local(SIGTERM, echo);
    report(attempt, stop_reason == "interrupted");
    return g_signal ? 128 + g_signal : 1;
  }

  Failure describe_failure(const Slot& s, const Process& p, int attempt) {
    Failure f;
    f.time_ms = p.exit_time_ms();
    // SIGPIPE is what a peer's death does to a process writing to it: not a cause.
    f.signal = p.term_signal() == SIGPIPE ? 0 : p.term_signal();
    std::string how = p.term_signal() ? "was killed by " + signal_name(p.term_signal())
                                      : "exited with code " + std::to_string(p.exit_code());
    std::ifstream ef(error_file(s));
    std::string kind;
    f.consequence = std::getline(ef, kind) && kind == "peer";
    f.summary = fmt::format("{} {} (node {}, {}, pid {}){}", s.name(), how, node_, my_ip_, p.pid(),
                            f.consequence ? " after losing a peer" : "");
    std::string log = o_.log_dir + "/" + s.log_name();
    f.text = fmt::format("root cause: {} {}\n  role {}, rank {}, local rank {}, machine {} ({}), attempt {}, at {}\n"
                         "  log {} (last lines):\n{}",
                         s.name(), how, s.role == SlotRole::Worker ? "worker" : "server", s.index, s.local, node_,
                         my_ip_, attempt, format_time(f.time_ms), log, indent(p.log_tail(20), "    | "));
    return f;
  }

  void drain_all(int echo) {
    for (size_t i = 0; i < procs_.size(); ++i) {
      std::string out = procs_[i]->drain();
      if (static_cast<int>(i) == echo && !out.empty()) std::cout << out << std::flush;
    }
  }

  void stop_local(int sig, int echo) {
    for (auto& p : procs_) p->signal(sig);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.grace_s * 1000));
    for (;;) {
      bool all = true;
      for (auto& p : procs_) all = p->poll_exit() && all;
      drain_all(echo);
      if (all) break;
      if (std::chrono::steady_clock::now() > deadline) {
        for (auto& p : procs_) p->signal(SIGKILL);
        deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    drain_all(echo);
  }

  void report(int attempt, bool interrupted) {
    const std::string a = fmt::format("a{}/", attempt);
    std::vector<Failure> all = local_failures_;
    local_failures_.clear();
    auto collect = [&]() {
      std::vector<Failure> out;
      try {
        auto n = store_->try_get(a + "nfail");
        int count = n ? std::atoi(std::string(n->begin(), n->end()).c_str()) : 0;
        for (int i = 1; i <= count; ++i)
          if (auto v = store_->try_get(fmt::format("{}fail/{}", a, i)))
            out.push_back(Failure::decode(std::string(v->begin(), v->end())));
      } catch (const std::exception&) {
      }
      return out;
    };
    auto reports = collect();
    if (nnodes_ > 1 && !interrupted) {
      // Reports from other machines may still be on their way.
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      auto again = collect();
      if (again.size() >= reports.size()) reports = std::move(again);
    }
    all.insert(all.end(), reports.begin(), reports.end());
    if (all.empty()) return;
    // The earliest failure that is not a consequence of losing a peer is the
    // root cause; a death by a signal (other than SIGPIPE) wins a tie: its
    // peers' errors follow it within milliseconds.
    std::stable_sort(all.begin(), all.end(), [](const Failure& x, const Failure& y) {
      if (x.consequence != y.consequence) return y.consequence;
      int64_t tx = x.time_ms - (x.signal ? 50 : 0), ty = y.time_ms - (y.signal ? 50 : 0);
      return tx < ty;
    });
    std::ostringstream r;
    r << "======================== dtrain: job failed ========================\n";
    r << all[0].text;
    if (all.size() > 1) {
      r << "  then:\n";
      for (size_t i = 1; i < all.size() && i < 8; ++i) r << "    " << all[i].summary << "\n";
    }
    r << fmt::format("  every other process of the job was stopped (SIGTERM, SIGKILL after {} s)\n", o_.grace_s);
    r << "====================================================================\n";
    std::cerr << r.str() << std::flush;
  }

  bool sync_nodes(const std::string& key) {
    try {
      store_->add(key, 1);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.join_timeout_s * 1000));
      for (;;) {
        auto v = store_->try_get(key);
        if (v && std::atoi(std::string(v->begin(), v->end()).c_str()) >= nnodes_) return true;
        if (g_signal || std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } catch (const std::exception& e) {
      std::cerr << "dtrain: cannot restart: " << e.what() << "\n";
      return false;
    }
  }

  void finish() {
    try {
      store_->set(fmt::format("exit/{}", node_), "1");
      if (node_ == 0 && nnodes_ > 1) {
        // Keep the store up until every machine has read the outcome.
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        std::vector<std::string> keys;
        for (int n = 0; n < nnodes_; ++n) keys.push_back(fmt::format("exit/{}", n));
        while (!store_->check(keys) && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    } catch (const std::exception&) {
    }
  }

  LaunchOptions o_;
  int nnodes_ = 1, node_ = 0;
  std::string my_ip_, store_host_, store_endpoint_;
  int store_port_ = 0;
  std::string token_, job_id_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;
  std::vector<Slot> slots_;
  bool listed_ = false;
  std::vector<NodeInfo> nodes_;
  std::vector<std::string> worker_eps_, server_eps_;
  std::vector<std::unique_ptr<Process>> procs_;
  std::set<int> reported_;
  std::vector<Failure> local_failures_;
  std::string error_dir_;
};

}  // namespace

int run_job(const LaunchOptions& options) { return JobRun(options).run(); }

}  // namespace dtrain::launch
