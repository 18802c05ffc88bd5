#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::launch {

// What one `dtrain` invocation runs on this machine.
struct LaunchOptions {
  std::vector<std::string> command;  // program and its arguments (a Python program: interpreter first)
  // A Python program (a .py file, or -m module): run by this interpreter
  // (--python, DTRAIN_PYTHON, else the one dtrain's Python package was built for).
  std::string python;
  // torch.distributed.launch's legacy contract: every worker's command ends
  // with --local_rank=N (--local_rank_arg).
  bool local_rank_arg = false;
  int nproc_per_node = 1;                // workers on this machine (collective mode)
  std::string nproc_source = "default";  // where nproc_per_node came from, for the table and errors
  // --gpus/--devices: CUDA device ids (indices among the visible devices);
  // workers take them in turn, nproc_per_node of them (resolve_devices sets
  // it to the number of devices unless --nproc_per_node says otherwise). In
  // parameter-server mode the workers take them in turn.
  std::vector<std::string> devices;
  std::string devices_source;  // "--gpus", or "every visible GPU (--backend nccl)"
  // Machines: --ips (this machine is the entry that is one of its addresses),
  // or --master host:port with --nnodes/--rank; neither means one machine.
  std::vector<std::string> ips;
  std::string master;
  int nnodes = 1;
  // --nnodes MIN:MAX: an elastic job of MIN to nnodes (MAX) machines, joined
  // by --master (see elastic.h); 0: a fixed number of machines.
  int nnodes_min = 0;
  double elastic_timeout_s = 60;  // below MIN: how long to wait for machines to join
  bool elastic() const { return nnodes_min > 0; }
  int node_rank = -1;
  int start_port = 0;  // the store's port; 0: any free port (one machine only)
  std::string log_dir = "log";
  // Parameter-server mode: servers and workers on this machine, or explicit
  // endpoint lists over all machines (the entries that are local run here).
  int server_num = 0;
  int worker_num = 0;
  std::vector<std::string> servers;
  std::vector<std::string> workers;
  std::string backend;
  int max_restarts = 0;
  std::string log_level;
  std::string job_id;
  // The store's secret on several machines (see dtrain/job_secret.h): a file only its
  // owner can read, else DTRAIN_JOB_TOKEN; insecure_open_job runs without one.
  std::string token_file;
  bool insecure_open_job = false;
  double grace_s = 5.0;  // SIGTERM -> SIGKILL
  // Parameter-server jobs: once every worker has exited 0, the launcher sets
  // the job store's root key "ps/stop" and gives the servers this long to
  // save (with [ps] save_on_exit) and exit 0; a server still running then is
  // killed and reported as the job's failure.
  double server_stop_s = 60.0;
  double join_timeout_s = 300;  // waiting for the other machines
};

// Runs the job to completion on this machine, coordinating with the `dtrain`
// of every other machine through the job store (served by node 0's dtrain).
// Returns the process exit code for `dtrain`: 0 when every process of every
// machine succeeded, else non-zero after printing one root-cause report.
// A parameter-server job succeeds when every worker exited 0 and then every
// server exited 0 after the stop key (see server_stop_s); a server that fails
// or dies before is a root cause like a worker. --max_restarts restarts
// servers and workers together (DTRAIN_RESTART_COUNT counts the attempts);
// a failure after every worker finished is not restarted.
//
// Blocks; installs handlers for SIGINT, SIGTERM, SIGHUP (forwarded to the job)
// and SIGCHLD. Must run on the main thread.
int run_job(const LaunchOptions& options);

}  // namespace dtrain::launch
