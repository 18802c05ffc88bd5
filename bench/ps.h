#pragma once
// `dtrain-bench ps`: the parameter-server backend (ps_grpc) timed with its
// servers and workers as processes on this host, beside two references on the
// same bytes: a bare gRPC echo server (the transport's ceiling) and Redis (a
// peer key-value store: rows as hash fields, pipelined through hiredis).

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dtrain::bench {

struct PsBenchOptions {
  std::string backend = "ps_grpc";
  int servers = 1;
  int workers = 1;
  std::vector<int> dims{8, 64};
  std::string min_keys = "1K", max_keys = "1M";      // sparse keys per call
  std::string min_bytes = "64K", max_bytes = "64M";  // dense bytes per call
  int step_factor = 4;
  int trials = 5;
  double target_ms = 150;            // wall time of one trial (iterations chosen from a warm-up call)
  int latency_calls = 2000;          // small calls per latency trial
  size_t chunk_bytes = 4 << 20;      // the references' largest message (ps_grpc's own default is 1 MiB)
  std::vector<std::string> options;  // the backend's own options, key=value
  std::vector<std::string> only;     // sparse, dense, latency ("" = all)
  std::vector<std::string> ops{"pull", "push"};
  bool no_grpc = false, no_redis = false;
  bool pin = false;        // each server and worker on a core of its own
  bool no_dtrain = false;  // the references alone
  int time_limit_s = 1200;
  bool verbose = false;
};

void add_ps_options(CLI::App* sub, PsBenchOptions& o);
// As the parent: starts the servers, the references and the workers, prints
// the table. As a child (started by the parent): one server or worker.
int run_ps_bench(const PsBenchOptions& o, const std::vector<std::string>& argv);

}  // namespace dtrain::bench
