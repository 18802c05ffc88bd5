#include "elastic.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/log.h"
#include "dtrain/sdk/strings.h"
#include "messages.h"
#include "join.h"
#include "process.h"
#include "report.h"

namespace dtrain::launch {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTick{200};
constexpr milliseconds kBeat{500};
// The first generation forms once MAX machines have joined, or MIN and no
// other joined for this long.
constexpr double kFirstSettleS = 3.0;

std::string text(const std::optional<Bytes>& b) { return b ? std::string(b->begin(), b->end()) : std::string(); }

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  for (const auto& part : sdk::split(s)) ids.push_back(std::atoi(part.c_str()));
  return ids;
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::vector<std::string> done_keys(int g, size_t n) {
  std::vector<std::string> keys;
  for (size_t pos = 0; pos < n; ++pos) keys.push_back(fmt::format("a{}/done/{}", g, pos));
  return keys;
}

}  // namespace

void parse_nnodes(const std::string& t, const std::string& what, int* min, int* max) {
  auto number = [&](const std::string& s) {
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end || v < 1 || v > 100000)
      throw InvalidUsage(
          fmt::format("{} '{}': expected a machine count N or MIN:MAX (torchrun's and Paddle's form, "
                      "e.g. 2:4), with counts from 1",
                      what, t));
    return static_cast<int>(v);
  };
  auto colon = t.find(':');
  if (colon == std::string::npos) {
    *min = 0;
    *max = number(t);
    return;
  }
  *min = number(t.substr(0, colon));
  *max = number(t.substr(colon + 1));
  if (*min > *max) throw InvalidUsage(fmt::format("{} '{}': MIN is larger than MAX", what, t));
}

std::optional<std::pair<int, int64_t>> read_step_file(const std::string& path) {
  std::ifstream f(path);
  int g = 0;
  long long step = 0;
  if (path.empty() || !(f >> g >> step)) return std::nullopt;
  return std::make_pair(g, static_cast<int64_t>(step));
}

std::string make_commit_folder(int* lock_fd) {
  namespace fs = std::filesystem;
  const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    if (e.path().filename().string().rfind("dtrain-elastic.", 0) != 0) continue;
    int fd = ::open((e.path() / "lock").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // not ours, or still being made
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) fs::remove_all(e.path(), ec);
    ::close(fd);
  }
  std::string tmpl = (base / fmt::format("dtrain-elastic.{}.XXXXXX", getpid())).string();
  if (!mkdtemp(tmpl.data()))
    throw IoError(
        fmt::format("cannot create the elastic commit folder in {}: {}", base.string(), std::strerror(errno)));
  *lock_fd = ::open((fs::path(tmpl) / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (*lock_fd < 0 || flock(*lock_fd, LOCK_EX) != 0)
    throw IoError(fmt::format("cannot lock the elastic commit folder {}: {}", tmpl, std::strerror(errno)));
  return tmpl;
}

ElasticCoordinator::ElasticCoordinator(std::shared_ptr<Store> store, const LaunchOptions& options,
                                       std::string step_file)
    : store_(std::move(store)), o_(options), step_file_(std::move(step_file)) {
  thread_ = std::thread([this] {
    try {
      run();
    } catch (const std::exception& e) {
      if (stop_) return;
      std::cerr << "dtrain: the elastic coordinator failed: " << e.what() << "\n" << std::flush;
      try {
        store_->set("el/outcome",
                    std::string("fail\nroot cause: dtrain's elastic coordinator on node 0 failed: ") + e.what() + "\n");
      } catch (const std::exception&) {
      }
    }
  });
}

ElasticCoordinator::~ElasticCoordinator() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ElasticCoordinator::sleep_tick() {
  std::this_thread::sleep_for(kTick);
  if (stop_) throw InvalidUsage("stopped");
}

void ElasticCoordinator::refresh() {
  const int n = std::atoi(text(store_->try_get("el/next")).c_str());
  const auto now = Clock::now();
  for (int id = 0; id <= n; ++id) {
    auto v = store_->try_get(fmt::format("el/hb/{}", id));
    if (!v) continue;
    std::string val = text(v);
    auto it = seen_.find(id);
    if (it == seen_.end() || it->second.value != val) seen_[id] = {val, now};
  }
}

bool ElasticCoordinator::fresh(int id) const {
  auto it = seen_.find(id);
  return it != seen_.end() && Clock::now() - it->second.changed < kElasticStale && !contains(dropped_, id);
}

bool ElasticCoordinator::silent(int id) const {
  auto it = seen_.find(id);
  return it == seen_.end() || Clock::now() - it->second.changed > kPeerSilenceLimit;
}

std::string ElasticCoordinator::name(int id) {
  auto it = names_.find(id);
  if (it != names_.end()) return it->second;
  std::string ip = "?";
  if (auto v = store_->try_get(fmt::format("el/info/{}", id)))
    ip = NodeInfo::decode(text(v), fmt::format("launch/el/info/{}", id)).ip;
  return names_[id] = fmt::format("machine {} ({})", id, ip);
}

std::vector<int> ElasticCoordinator::candidates(const std::vector<int>& members) {
  std::vector<int> out = members;
  for (const auto& [id, seen] : seen_) {
    if (contains(out, id) || !fresh(id)) continue;
    auto info = store_->try_get(fmt::format("el/info/{}", id));
    if (!info) continue;
    const std::string version = NodeInfo::decode(text(info), fmt::format("launch/el/info/{}", id)).version;
    if (version != core_version()) {  // refused alone: the job goes on
      const std::string why = fmt::format("{} runs dtrain {} but node 0 runs {}: install the same version everywhere",
                                          name(id), version, core_version());
      std::cout << "dtrain: elastic: refusing " << why << "\n" << std::flush;
      store_->set(fmt::format("el/refused/{}", id), why);
      dropped_.push_back(id);
      continue;
    }
    out.push_back(id);
  }
  if (out.size() > static_cast<size_t>(o_.nnodes)) out.resize(o_.nnodes);
  return out;
}

std::vector<int> ElasticCoordinator::wait_for(int need, const std::vector<int>& members, double timeout_s,
                                              double settle_s) {
  const auto start = Clock::now();
  auto grew = start;
  size_t last = 0;
  for (;;) {
    refresh();
    auto c = candidates(members);
    if (c.size() != last) grew = Clock::now(), last = c.size();
    if (c.size() >= static_cast<size_t>(o_.nnodes)) return c;
    if (c.size() >= static_cast<size_t>(need) && since(grew) >= settle_s) return c;
    if (since(start) > timeout_s) return c;
    sleep_tick();
  }
}

ElasticCoordinator::End ElasticCoordinator::watch(int g, const std::vector<int>& members,
                                                  std::optional<Clock::time_point> ended) {
  const std::string a = fmt::format("a{}/", g);
  const auto done = done_keys(g, members.size());
  for (;;) {
    sleep_tick();
    refresh();
    if (auto st = ended ? read_step_file(step_file_) : std::nullopt; st && st->first == g) {
      std::cout << fmt::format(
                       "dtrain: elastic generation {} is training (global step {}) {:.1f} s after generation "
                       "{} ended\n",
                       g, st->second, since(*ended), g - 1)
                << std::flush;
      ended.reset();
    }
    if (store_->check(done)) return End::Done;
    if (store_->try_get(a + "stop")) return End::Failure;
    for (int m : members)
      if (silent(m)) {
        Failure f =
            machine_failure(unix_ms() - std::chrono::duration_cast<milliseconds>(kPeerSilenceLimit).count(),
                            fmt::format("dtrain on {} stopped responding", name(m)),
                            fmt::format(" (no heartbeat for {} s): that machine or its dtrain died, or its link is cut",
                                        kPeerSilenceLimit.count()));
        int64_t i = store_->add(a + "nfail", 1);
        store_->set(fmt::format("{}fail/{}", a, i), f.encode());
        store_->set(a + "stop", "1");
        return End::Lost;
      }
    if (members.size() < static_cast<size_t>(o_.nnodes)) {
      auto c = candidates(members);
      if (c.size() > members.size()) {
        store_->set(a + "regroup", name(c[members.size()]) + " joins");
        return End::Join;
      }
    }
  }
}

std::vector<int> ElasticCoordinator::collect_acks(int g, const std::vector<int>& members) {
  const auto deadline = Clock::now() + milliseconds(static_cast<int64_t>((o_.grace_s + 5) * 1000));
  for (;;) {
    refresh();
    std::vector<int> acked, waiting;
    for (int m : members) (store_->try_get(fmt::format("el/ack/{}/{}", g, m)) ? acked : waiting).push_back(m);
    bool all_stale = std::all_of(waiting.begin(), waiting.end(), [&](int m) {
      auto it = seen_.find(m);
      return it == seen_.end() || Clock::now() - it->second.changed > kElasticStale;
    });
    if (waiting.empty() || all_stale || Clock::now() > deadline) return acked;
    sleep_tick();
  }
}

void ElasticCoordinator::fail(int g, const std::string& why, std::optional<Failure> cause) {
  std::vector<Failure> all;
  if (cause) all.push_back(*cause);
  const std::string a = fmt::format("a{}/", g);
  const int n = std::atoi(text(store_->try_get(a + "nfail")).c_str());
  for (int i = 1; i <= n; ++i)
    if (auto v = store_->try_get(fmt::format("{}fail/{}", a, i))) all.push_back(Failure::decode(text(v)));
  std::string report;
  if (!all.empty()) {
    order_by_root_cause(all);
    report = failure_report(all, o_.grace_s);
  }
  store_->set("el/outcome", "fail\n" + why + "\n" + report);
}

void ElasticCoordinator::run() {
  std::vector<int> members = wait_for(o_.nnodes_min, {0}, o_.join_timeout_s,
                                      o_.nnodes > o_.nnodes_min ? kFirstSettleS : 0.0);  // node 0 first, always
  if (members.size() < static_cast<size_t>(o_.nnodes_min)) {
    store_->set("el/outcome", fmt::format("fail\nroot cause: only {} of at least {} machines joined the elastic job "
                                          "within {} s (--nnodes {}:{}, --join_timeout)\n",
                                          members.size(), o_.nnodes_min, o_.join_timeout_s, o_.nnodes_min, o_.nnodes));
    return;
  }
  int crashes = 0;
  std::optional<Clock::time_point> last_end;  // when the generation before ended
  for (int g = 0;; ++g) {
    store_->set(fmt::format("el/g{}", g), sdk::join([&] {
                  std::vector<std::string> v;
                  for (int m : members) v.push_back(std::to_string(m));
                  return v;
                }()));
    store_->set("el/gen", std::to_string(g));
    std::vector<std::string> names;
    for (int m : members) names.push_back(name(m));
    std::cout << fmt::format("dtrain: elastic generation {}: {} machine{}: {}\n", g, members.size(),
                             members.size() == 1 ? "" : "s", sdk::join(names, ", "))
              << std::flush;
    End end = watch(g, members, last_end);
    const auto ended = Clock::now();
    if (end == End::Done) {
      store_->set("el/outcome", "done");
      return;
    }
    auto acked = collect_acks(g, members);
    if (end == End::Join && store_->check(done_keys(g, members.size()))) {
      store_->set("el/outcome", "done");  // every worker had finished as the machine asked to join
      return;
    }
    std::vector<int> left;
    for (int m : members)
      if (!contains(acked, m) || (end == End::Lost && silent(m)))  // a live main loop does not keep a dead heartbeat in
        left.push_back(m), dropped_.push_back(m);
    acked.erase(std::remove_if(acked.begin(), acked.end(), [&](int m) { return contains(left, m); }), acked.end());
    auto step = read_step_file(step_file_);
    std::string at = step ? fmt::format(" at global step {}", step->second) : "";
    std::string why = end == End::Join ? text(store_->try_get(fmt::format("a{}/regroup", g))) : "a process failed";
    if (end == End::Lost) why = "a machine stopped responding";
    std::vector<std::string> left_names;
    for (int m : left) left_names.push_back(name(m));
    std::cout << fmt::format("dtrain: elastic generation {} ended{} ({}){}\n", g, at, why,
                             left.empty() ? "" : "; left: " + sdk::join(left_names, ", "))
              << std::flush;
    if (end == End::Failure && left.empty() && ++crashes > o_.max_restarts) {
      fail(g, fmt::format("dtrain: the elastic job failed: a process failed in {} generation{} with every machine "
                          "still there (--max_restarts {})",
                          crashes, crashes == 1 ? "" : "s", o_.max_restarts));
      return;
    }
    members = acked;
    last_end = ended;
    if (members.empty() || members.front() != 0) {
      fail(g, "dtrain: the elastic job failed: node 0 (the store's host) could not stop its processes");
      return;
    }
    members = wait_for(o_.nnodes_min, members,
                       members.size() < static_cast<size_t>(o_.nnodes_min) ? o_.elastic_timeout_s : 0, 0);
    if (members.size() < static_cast<size_t>(o_.nnodes_min)) {
      std::vector<std::string> lost;
      for (int m : dropped_) lost.push_back(name(m));
      const std::string summary = fmt::format(
          "the elastic job has {} machine{} left, fewer than --nnodes {}:{}, and none joined within "
          "--elastic_timeout {} s; machines lost: {}",
          members.size(), members.size() == 1 ? "" : "s", o_.nnodes_min, o_.nnodes, o_.elastic_timeout_s,
          sdk::join(lost, ", "));
      fail(g, "dtrain: the elastic job failed: " + summary, machine_failure(unix_ms(), summary, ""));
      return;
    }
  }
}

ElasticHeartbeat::ElasticHeartbeat(std::shared_ptr<Store> store, int id) {
  thread_ = std::thread([this, store = std::move(store), id] {
    for (int64_t n = 1; !stop_; ++n) {
      try {
        store->set(fmt::format("el/hb/{}", id), std::to_string(n));
      } catch (const std::exception&) {
        // Tried again next beat; a store that is really gone fails the member's own calls.
      }
      for (int i = 0; i < 5 && !stop_; ++i) std::this_thread::sleep_for(kBeat / 5);
    }
  });
}

ElasticHeartbeat::~ElasticHeartbeat() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

int run_member(Store& store, int id, const std::function<int(int, std::vector<NodeInfo>, int)>& run,
               const std::function<bool()>& stop, const std::function<void()>& interrupted) {
  int code = 1, last = -1;
  for (;;) {
    interrupted();
    if (auto o = store.try_get("el/outcome")) {
      const std::string outcome = text(o);
      if (outcome == "done") return 0;
      std::cerr << outcome.substr(outcome.find('\n') + 1) << std::flush;
      return 1;
    }
    if (auto why = store.try_get(fmt::format("el/refused/{}", id))) {
      std::cerr << "dtrain: the elastic job refused this machine: " << text(why) << "\n";
      return 1;
    }
    auto v = store.try_get("el/gen");
    const int g = v ? std::atoi(text(v).c_str()) : -1;
    if (g <= last) {
      std::this_thread::sleep_for(kTick);
      continue;
    }
    auto members = parse_ids(text(store.try_get(fmt::format("el/g{}", g))));
    if (!contains(members, id)) {
      if (last < 0) {  // waiting to join
        std::this_thread::sleep_for(kTick);
        continue;
      }
      std::cerr << fmt::format(
          "dtrain: this machine (member {}) was left out of elastic generation {}: the coordinator on node 0 lost "
          "it (no heartbeat, or it did not stop its processes in time)\n",
          id, g);
      return 1;
    }
    std::vector<NodeInfo> nodes;
    int self = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] == id) self = static_cast<int>(i);
      const std::string key = fmt::format("el/info/{}", members[i]);
      auto info = store.get(key, std::chrono::seconds(10));
      nodes.push_back(NodeInfo::decode(std::string(info.begin(), info.end()), "launch/" + key));
    }
    code = run(g, std::move(nodes), self);
    last = g;
    if (stop()) return code ? code : 1;
    try {
      store.set(fmt::format("el/ack/{}/{}", g, id), "1");
    } catch (const std::exception&) {
    }
  }
}

}  // namespace dtrain::launch
