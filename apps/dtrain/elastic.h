#pragma once
// Elastic jobs (`--nnodes MIN:MAX` with --master): the job's membership is a
// numbered generation in the job store. Node 0's dtrain (the store's host)
// runs the coordinator, which alone decides the generations; every machine's
// dtrain (node 0's too) is a member that heartbeats, runs its workers for each
// generation it belongs to, and stops them when the generation ends.
//
// Store keys (under the launchers' "launch/" prefix):
//   el/next           counter of member ids (node 0 is id 0; the others add)
//   el/info/<id>      the member's NodeInfo (its node field is the id)
//   el/hb/<id>        its heartbeat, a counter set every 500 ms
//   el/g<g>           generation g's members, "id,id,...": position = node index
//   el/gen            the newest generation (set after el/g<g>)
//   el/ack/<g>/<id>   the member has stopped its processes of generation g
//   el/outcome        "done", or "fail" + newline + the root-cause report
//   a<g>/regroup      generation g ends without a failure (a machine joins)
// Generation g is attempt g of the launcher (keys a<g>/..., DTRAIN_RESTART_COUNT).

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/store.h"
#include "launcher.h"
#include "messages.h"

namespace dtrain::launch {

// "MIN:MAX" or "N" (PADDLE_NNODES, PET_NNODES, --nnodes). Sets *min to 0 for a
// plain count. Throws InvalidUsage naming `what` on a malformed value.
void parse_nnodes(const std::string& text, const std::string& what, int* min, int* max);

// How long a member's heartbeat may stand still before the coordinator waits
// for it no more when a generation ends (its dtrain is gone).
constexpr std::chrono::milliseconds kElasticStale{4000};

// The global step and generation in a member's step file ("<generation> <global step>"), if any.
std::optional<std::pair<int, int64_t>> read_step_file(const std::string& path);

// Runs on node 0's dtrain, in a thread of its own with its own store client,
// by the job's options: --nnodes MIN:MAX, --elastic_timeout, --join_timeout
// (the first generation), --grace_period (bounds a member's ack) and
// --max_restarts (generations ended by a crash with every machine still
// there). step_file: node 0's commit folder's step file (fleet/elastic.h),
// for the global step in the log. Prints every membership change on stdout.
// Ends when it sets el/outcome; should it fail, el/outcome says so and ends
// the running generation on every machine too (the launchers watch it).
class ElasticCoordinator {
 public:
  ElasticCoordinator(std::shared_ptr<Store> store, const LaunchOptions& options, std::string step_file);
  ~ElasticCoordinator();  // stops and joins the thread
  ElasticCoordinator(const ElasticCoordinator&) = delete;
  ElasticCoordinator& operator=(const ElasticCoordinator&) = delete;

 private:
  struct Seen {
    std::string value;
    std::chrono::steady_clock::time_point changed;
  };
  enum class End { Done, Failure, Lost, Join };

  void run();
  void refresh();
  bool fresh(int id) const;
  bool silent(int id) const;
  std::string name(int id);
  std::vector<int> candidates(const std::vector<int>& members);
  std::vector<int> wait_for(int need, const std::vector<int>& members, double timeout_s, double settle_s);
  // Until generation g ends; meanwhile reports when it trains (its step file)
  // `ended` after the one before ended.
  End watch(int g, const std::vector<int>& members, std::optional<std::chrono::steady_clock::time_point> ended);
  std::vector<int> collect_acks(int g, const std::vector<int>& members);
  // Sets the outcome: why, then the report of generation g's failures with
  // `cause` (when given) as their root cause.
  void fail(int g, const std::string& why, std::optional<Failure> cause = std::nullopt);
  void sleep_tick();

  std::shared_ptr<Store> store_;
  const LaunchOptions o_;
  const std::string step_file_;
  std::map<int, Seen> seen_;
  std::map<int, std::string> names_;
  std::vector<int> dropped_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Sets el/hb/<id> every 500 ms from a thread of its own (its own store client),
// so that a member stopping its processes or waiting for a generation stays alive.
class ElasticHeartbeat {
 public:
  ElasticHeartbeat(std::shared_ptr<Store> store, int id);
  ~ElasticHeartbeat();
  ElasticHeartbeat(const ElasticHeartbeat&) = delete;
  ElasticHeartbeat& operator=(const ElasticHeartbeat&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// This machine's commit folder for an elastic job's workers (DTRAIN_ELASTIC_DIR):
// /dev/shm/dtrain-elastic.<pid>.XXXXXX (else in the temporary folder), with
// its file "lock" locked (flock) through *lock_fd, which the caller keeps open
// while the folder is in use. Folders whose lock nobody holds (their dtrain
// was killed) are removed first; the lock, not the pid, says so, since
// containers may share /dev/shm but not their pids.
std::string make_commit_folder(int* lock_fd);

// Runs this member's generations until the job's outcome: for each generation
// that lists `id`, run(generation, its machines in node order, this one's
// position) runs this machine's processes and returns their exit code, then
// the member acknowledges (el/ack). stop() is asked after each generation (a
// signal, a lost store); `interrupted` is polled while waiting and may throw.
// Returns dtrain's exit code: 0 when the outcome is "done"; 1 after printing
// the outcome's report, or why this machine was left out or refused.
int run_member(Store& store, int id, const std::function<int(int, std::vector<NodeInfo>, int)>& run,
               const std::function<bool()>& stop, const std::function<void()>& interrupted);

}  // namespace dtrain::launch
